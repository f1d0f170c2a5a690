//! Designs in TOML: the shipped examples plan, and every kind of mistake is an error that
//! names its field and what is allowed.

use monel_fabric::*;

const BASE: &str = r#"
gpus = 64
[server]
gpus = 8
nics = 8
[fabric]
kind = "leaf-spine"
link_speed = "400Gbps"
radix = 16
"#;

fn error(text: &str) -> ConfigError {
    parse_design(text, "t", None).map(|_| ()).unwrap_err()
}

#[test]
fn shipped_examples_plan() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/fabric");
    let mut seen = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "toml") {
            let text = std::fs::read_to_string(&p).unwrap();
            let d = parse_design(&text, "x", Some(512)).unwrap_or_else(|e| panic!("{p:?}: {e}"));
            let r = evaluate(d).unwrap_or_else(|e| panic!("{p:?}: {e}"));
            assert!(
                r.outcome.busbw > 0.0 && r.step.is_some() && r.cost.is_some(),
                "{p:?}"
            );
            let shown = r.to_string();
            assert!(
                shown.contains("busbw") && shown.contains("per GPU"),
                "{shown}"
            );
            seen += 1;
        }
    }
    assert!(seen >= 5, "{seen} examples");
}

#[test]
fn sizing_follows_the_design() {
    let d = parse_design(BASE, "t", None).unwrap();
    // 64 NIC ports on radix-16 leaves of 8 down / 8 up: 8 leaves, 8 spines.
    assert_eq!(d.cluster.fabric.switches_per_tier, vec![8, 8]);
    let d = parse_design(
        &BASE.replace("radix = 16", "radix = 16\noversubscription = 3"),
        "t",
        None,
    )
    .unwrap();
    assert_eq!(d.cluster.fabric.switches_per_tier, vec![6, 4]); // 12 down, 4 up
    let ft = BASE
        .replace("leaf-spine", "fat-tree")
        .replace("radix = 16", "radix = 8");
    let d = parse_design(&ft, "t", None).unwrap();
    assert_eq!(
        d.cluster.fabric.switches_per_tier.len(),
        3,
        "64 ports need 3 tiers at k=8"
    );
    let ib = ft.replace("kind", "transport = \"infiniband\"\nkind");
    assert_eq!(
        parse_design(&ib, "t", None).unwrap().cluster.fabric.routing,
        Routing::DestMod
    );
}

#[test]
fn mistakes_name_the_field_and_the_allowed_values() {
    let cases: &[(&str, &str, &str)] = &[
        (
            "radix = 16",
            "radix = 16\nlinkspeed = \"1Gbps\"",
            "fabric.linkspeed",
        ),
        ("kind = \"leaf-spine\"", "kind = \"torus\"", "fabric.kind"),
        (
            "link_speed = \"400Gbps\"",
            "link_speed = 400",
            "fabric.link_speed",
        ),
        (
            "link_speed = \"400Gbps\"",
            "link_speed = \"400GB\"",
            "fabric.link_speed",
        ),
        ("link_speed = \"400Gbps\"", "", "fabric.link_speed"),
        ("nics = 8", "nics = 3", "server.nics"),
        ("gpus = 64", "gpus = 0", "gpus"),
        ("gpus = 64", "gpus = 100000", "gpus"),
        ("radix = 16", "radix = 16\ntiers = 3", "fabric.tiers"),
        ("[fabric]", "[fabrik]\n[fabric]", "fabrik"),
    ];
    for (from, to, field) in cases {
        let e = error(&BASE.replace(from, to));
        assert_eq!(e.field, *field, "{to}: {e}");
        assert!(!e.why.is_empty());
    }
    let e = error(&BASE.replace("radix = 16", "radix = 16\nlinkspeed = \"1Gbps\""));
    assert!(e.why.contains("did you mean link_speed"), "{e}");
    let e = error(&BASE.replace("kind = \"leaf-spine\"", "kind = \"torus\""));
    assert!(
        e.why.contains("leaf-spine, fat-tree, rail-optimized"),
        "{e}"
    );
    let e = error(&format!(
        "{BASE}[collective]\nalgorithm = \"tree\"\nop = \"alltoall\"\n"
    ));
    assert_eq!(e.field, "collective.algorithm");
    let e = error(&format!("{BASE}[training]\nforward = \"1ms\"\n"));
    assert_eq!(e.field, "training.backward");
    let e = error("gpus = [");
    assert_eq!(e.field, "toml");
}

#[test]
fn sweep_rows_and_svg() {
    let r = evaluate(parse_design(BASE, "base", None).unwrap()).unwrap();
    let row = SweepRow::from(&r);
    assert_eq!(
        row.csv().split(',').count(),
        SweepRow::HEADER.split(',').count()
    );
    let svg = svg_chart(
        "t",
        "GPUs",
        "GB/s",
        &[("base".into(), vec![(64.0, row.busbw / 1e9), (128.0, 1.0)])],
    );
    assert!(
        svg.starts_with("<svg") && svg.contains("polyline") && svg.trim_end().ends_with("</svg>")
    );
}
