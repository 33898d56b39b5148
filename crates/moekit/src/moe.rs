//! The MoE block (TODO).
