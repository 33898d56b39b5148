//! Unit tests of `decode.rs`.

use super::*;

#[test]
fn tile_table_fits_budgets_for_every_row_size() {
    // qwen3-30b-a3b affine4-g64 (bf16 scales): gate/up rows 1024 B + 64 B
    // of scales; down rows 384 B + 24 B.
    let t = tiles((1024, 64), (384, 24));
    assert_eq!((t.gu_rows, t.down_rows), (32, 8));
    // q8_0: 2176-byte gate rows halve the gate/up tile.
    assert_eq!(tiles((2176, 0), (816, 0)).gu_rows, 16);
    // bf16 weights: 4 KiB rows.
    let d = tiles((4096, 0), (1536, 0));
    assert_eq!((d.gu_rows, d.down_rows), (8, 2));
    for (g, dn) in [
        ((1024, 64), (384, 24)),
        ((4096, 0), (1536, 0)),
        ((16384, 0), (57344, 0)),
    ] {
        let t = tiles(g, dn);
        assert!(t.gu_rows == 1 || 2 * tile_room(t.gu_rows, g) <= GU_BUDGET);
        assert!(t.down_rows == 1 || DOWN_RING * tile_room(t.down_rows, dn) <= DOWN_BUDGET);
        assert_eq!(t.down_room, tile_room(t.down_rows, dn));
        assert_eq!(t.down_room % 16, 0);
    }
}

#[test]
fn mma_split_gives_each_warp_about_four_spans() {
    // qwen3-30b-a3b: gate/up K = 2048 (16 spans), down K = 768 (6).
    assert_eq!((mma_split(2048), mma_rows(2048)), (4, 32));
    assert_eq!((mma_split(768), mma_rows(768)), (2, 64));
    // Mixtral: K = 4096 and 14336 (112 spans: all 8 warps, 14 each).
    assert_eq!(mma_split(4096), 8);
    assert_eq!(mma_split(14336), 8);
    assert_eq!((mma_split(32), mma_rows(32)), (1, 128));
    for k in (32..20000).step_by(32) {
        let s = mma_split(k);
        assert!(
            s.is_power_of_two() && s <= MMA_WARPS && MMA_WARPS.is_multiple_of(s),
            "K={k}"
        );
    }
}

#[test]
fn route_kernel_instances_only_for_router_formats() {
    let inst = instances();
    let mut ggml = 0;
    for (f, ft) in all_format_types() {
        let route = format!("moekit::decode_route<{ft}, __nv_bfloat16>");
        assert_eq!(
            inst.iter().any(|(_, e)| *e == route),
            router_format_ok(f),
            "{ft}"
        );
        ggml += usize::from(matches!(f, WeightFormat::Ggml(_)));
    }
    assert!(ggml >= 10 && router_format_ok(WeightFormat::Dense(DType::F32)));
}

#[test]
fn stage_room_covers_any_alignment() {
    // A range of n bytes starting h bytes past a 16-byte boundary is
    // copied as ⌈(h + n) / 16⌉ words.
    for n in [1usize, 15, 16, 17, 100, 1024] {
        for h in 0..16 {
            assert!((h + n).div_ceil(16) * 16 <= stage_room(n), "n={n} h={h}");
        }
    }
}

#[test]
fn every_rule_and_team_has_a_routing_kernel_instance() {
    use crate::ops::route::GroupMask;
    let grouped = |scoring| RouterKind::Grouped {
        scoring,
        bias: None,
        n_group: 8,
        topk_group: 4,
        dropped_groups: GroupMask::Zero,
        norm_topk_prob: true,
        routed_scaling_factor: 1.0,
    };
    let kinds = [
        RouterKind::SoftmaxTopK {
            norm_topk_prob: false,
        },
        RouterKind::TopKSoftmax,
        RouterKind::Gemma4 {
            per_expert_scale: vec![1.0; 4],
        },
        grouped(Scoring::Softmax),
        grouped(Scoring::Sigmoid),
    ];
    let inst = instances();
    let codes: std::collections::BTreeSet<u32> = kinds.iter().map(rule_code).collect();
    assert_eq!(codes.len(), kinds.len(), "one code a rule");
    for code in codes {
        assert!(code < RULES, "rule code {code}");
        for team in [TEAM_BLOCK, TEAM_WARP] {
            let name = tail_kernel(code, team);
            assert!(
                inst.iter()
                    .any(|(s, e)| *e == name && s.name == "decode_tail.cu"),
                "{name}"
            );
        }
    }
    // The block team only up to kBlockKeys experts; a warp each past the knob's T.
    assert_eq!(team_for(1, 256), TEAM_BLOCK);
    assert_eq!(team_for(1, 257), TEAM_WARP);
    assert_eq!(team_for(MAX_TOKENS, 128), TEAM_WARP);
}
