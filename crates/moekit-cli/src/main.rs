//! The `moekit` command-line tool.
fn main() {}
