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
            // Packet-level designs run at their own (small) size; the others at 512 GPUs.
            let packet = text.contains("engine = \"packet\"");
            let gpus = if packet { None } else { Some(512) };
            let d = parse_design(&text, "x", gpus).unwrap_or_else(|e| panic!("{p:?}: {e}"));
            let r = evaluate(d).unwrap_or_else(|e| panic!("{p:?}: {e}"));
            assert!(
                r.outcome.busbw > 0.0 && (packet || r.step.is_some()) && r.cost.is_some(),
                "{p:?}"
            );
            let shown = r.to_string();
            assert!(
                shown.contains("busbw") && shown.contains("per GPU"),
                "{shown}"
            );
            if packet {
                let pk = r.outcome.packet.as_ref().expect("the packet engine ran");
                assert!(pk.events > 0 && shown.contains("pause frames"), "{shown}");
            }
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
        (
            "radix = 16",
            "radix = 16\nheader_bytes = -1",
            "fabric.header_bytes",
        ),
        (
            "radix = 16",
            "radix = 16\npfc_alpha = 0",
            "fabric.pfc_alpha",
        ),
        (
            "radix = 16",
            "radix = 16\npfc_threshold = \"1KiB\"",
            "fabric.pfc_threshold",
        ),
        (
            "radix = 16",
            "radix = 16\npfc_threshold = 60000",
            "fabric.pfc_threshold",
        ),
        (
            "radix = 16",
            "radix = 16\npfc_resume = \"x\"",
            "fabric.pfc_resume",
        ),
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
fn packet_settings_congestion_and_competing_jobs() {
    let text = format!(
        "{BASE}mtu = \"1KiB\"\nswitch_buffer = \"16MiB\"\nadaptive_routing = true\n\
         [congestion]\necn_kmin = \"100KB\"\necn_kmax = \"400KB\"\necn_pmax = 0.1\n\
         rate_ai = \"20Mbps\"\ntimer = \"55us\"\n\
         [background]\ngpus = 16\nop = \"alltoall\"\nalgorithm = \"direct\"\nsize = \"8MiB\"\n\
         [sim]\nengine = \"packet\"\n"
    );
    let d = parse_design(&text, "t", None).unwrap();
    assert_eq!(d.engine, Engine::Packet);
    let p = d.scenario.packet.as_ref().unwrap();
    assert_eq!((p.mtu, p.switch_buffer_bytes), (1024, 16 << 20));
    assert!(p.adaptive_routing && p.flow_control == FlowControl::Pfc);
    assert_eq!(
        p.ecn,
        Some(Ecn {
            kmin_bytes: 100_000,
            kmax_bytes: 400_000,
            pmax: 0.1
        })
    );
    let dc = p.dcqcn.unwrap();
    assert_eq!(dc.rate_ai_bps, 20e6);
    assert_eq!(dc.time_reset, std::time::Duration::from_micros(55));
    assert_eq!(dc.line_rate_bps, 400e9);
    // The competing job sits on the servers after the planned job's, and the fabric grows
    // to hold both.
    let b = &d.scenario.background[0];
    assert_eq!(b.spec.ranks, 16);
    assert_eq!(d.scenario.placement, Placement::Packed);
    assert_eq!(d.cluster.gpus(), 80);

    let cases: &[(&str, &str)] = &[
        ("flow_control = \"credits\"", "fabric.flow_control"),
        ("adaptive_routing = 1", "fabric.adaptive_routing"),
        ("mtu = \"64B\"", "fabric.mtu"),
        ("mtu = 4096", "fabric.mtu"),
        ("[congestion]\necn_pmax = 2.0", "congestion.ecn_pmax"),
        (
            "[congestion]\necn_kmin = \"1MB\"\necn_kmax = \"10KB\"",
            "congestion.ecn_kmin",
        ),
        ("[congestion]\nalgorithm = \"hpcc\"", "congestion.algorithm"),
        ("[congestion]\nrate_ai = 5", "congestion.rate_ai"),
        ("[background]\nop = \"alltoall\"", "background.gpus"),
        (
            "[background]\ngpus = 8\nalgorithm = \"rings\"",
            "background.algorithm",
        ),
        ("[sim]\nengine = \"packets\"", "sim.engine"),
        (
            "[background]\ngpus = 8\nplacement = \"random\"",
            "background.placement",
        ),
    ];
    for (add, field) in cases {
        let e = error(&format!("{BASE}{add}\n"));
        assert_eq!(e.field, *field, "{add}: {e}");
    }
    let e = error(&format!("{BASE}[sim]\nengine = \"packets\"\n"));
    assert!(e.why.contains("auto, event, lockstep, packet"), "{e}");
    // InfiniBand has credits, not PFC, ECN or DCQCN.
    let ib = BASE.replace("kind", "transport = \"infiniband\"\nkind");
    let e = error(&format!("{ib}flow_control = \"pfc\"\n"));
    assert_eq!(e.field, "fabric.flow_control");
    assert!(e.why.contains("credits"), "{e}");
    let e = error(&format!("{ib}[congestion]\nalgorithm = \"dcqcn\"\n"));
    assert!(e.why.contains("not modelled"), "{e}");
    let d = parse_design(&ib, "t", None).unwrap();
    let p = d.scenario.packet.unwrap();
    assert_eq!(
        (p.flow_control, p.ecn, p.dcqcn),
        (FlowControl::Credits, None, None)
    );
}

#[test]
fn sweep_rows_have_a_field_per_header_column() {
    let r = evaluate(parse_design(BASE, "base", None).unwrap()).unwrap();
    let row = SweepRow::from(&r);
    assert_eq!(
        row.csv().split(',').count(),
        SweepRow::HEADER.split(',').count()
    );
}

#[test]
fn flow_level_plans_warn_where_lossless_links_are_shared() {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/fabric/roce-leaf-spine.toml");
    let text = std::fs::read_to_string(p).unwrap();
    let report = |text: &str| evaluate(parse_design(text, "t", Some(1024)).unwrap()).unwrap();
    let r = report(&text);
    let s = r.outcome.stats.as_ref().expect("the lockstep engine ran");
    assert!(
        s.max_flows_per_fabric_link > 1,
        "the example collides at this size"
    );
    let out = r.to_string();
    assert!(
        out.contains("warning: flows collide") && out.contains("engine = \"packet\""),
        "{out}"
    );
    // A lossy fabric drops instead of pausing: no such warning.
    let lossy = text.replace("[fabric]", "[fabric]\nflow_control = \"lossy\"");
    assert!(
        !report(&lossy)
            .to_string()
            .contains("warning: flows collide")
    );
}

#[test]
fn auto_runs_what_nccls_tuner_would_and_a_forced_algorithm_stays() {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/fabric/roce-leaf-spine.toml");
    let text = std::fs::read_to_string(p).unwrap();
    assert!(text.contains("algorithm = \"auto\""));
    // 4096 GPUs: trees, for the 1 GiB collective and for every 25 MiB bucket.
    let r = evaluate(parse_design(&text, "t", None).unwrap()).unwrap();
    assert_eq!(r.design.spec.algo, monel_sched::plan::Algorithm::Tree);
    let step = r.step.as_ref().unwrap();
    assert!(
        step.algorithms
            .iter()
            .all(|(_, a)| *a == monel_sched::plan::Algorithm::Tree),
        "{step:?}"
    );
    let out = r.to_string();
    assert!(
        out.contains("algorithm: tree/")
            && out.contains("by NCCL's tuning model")
            && out.contains("against ring/"),
        "{out}"
    );
    // Forced to the flat ring, the same step exposes over a second of communication; NCCL's
    // choice hides nearly all of it behind backward.
    let ring = text.replace("algorithm = \"auto\"", "algorithm = \"ring\"");
    let forced = evaluate(parse_design(&ring, "t", None).unwrap()).unwrap();
    let forced_step = forced.step.as_ref().unwrap();
    assert!(forced_step.exposed_s > 1.0, "{forced_step:?}");
    assert!(step.exposed_s < 0.01 * forced_step.exposed_s, "{step:?}");
    assert!(
        forced
            .to_string()
            .contains("algorithm: ring (forced by the design)")
    );
    // Two servers: the ring's bandwidth wins at 1 GiB.
    let d = parse_design(&text, "t", Some(16)).unwrap();
    assert_eq!(d.spec.algo, monel_sched::plan::Algorithm::Ring);
    assert!(d.choice.is_some());
    // All-to-all has one algorithm; a made-up one names auto among the choices.
    let a2a = format!("{BASE}[collective]\nop = \"alltoall\"\n");
    let d = parse_design(&a2a, "t", None).unwrap();
    assert_eq!(d.spec.algo, monel_sched::plan::Algorithm::Direct);
    let out = evaluate(d).unwrap().to_string();
    assert!(
        out.contains("algorithm: direct (the only one alltoall has)"),
        "{out}"
    );
    let e = error(&format!("{BASE}[collective]\nalgorithm = \"spiral\"\n"));
    assert!(e.to_string().contains("auto, ring"), "{e}");
    let e = error(&format!(
        "{BASE}[collective]\nop = \"broadcast\"\nalgorithm = \"tree\"\n"
    ));
    assert!(e.to_string().contains("want auto or one of ring"), "{e}");
}

#[test]
fn acks_are_off_unless_the_design_turns_them_on() {
    let d = parse_design(BASE, "t", None).unwrap();
    assert!(!d.scenario.packet.unwrap().acks);
    let on = BASE.replace("radix = 16\n", "radix = 16\nacks = true\n");
    assert!(
        parse_design(&on, "t", None)
            .unwrap()
            .scenario
            .packet
            .unwrap()
            .acks
    );
    let e = error(&BASE.replace("radix = 16\n", "radix = 16\nacks = \"yes\"\n"));
    assert_eq!(e.field, "fabric.acks", "{e}");
}
