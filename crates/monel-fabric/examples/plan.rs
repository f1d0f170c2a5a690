//! A fabric plan through the library: a design (a rail-optimized RoCE cluster of 512 GPUs)
//! parsed from TOML, the AllReduce it implies replayed on it, and the planner's report.
//!
//!   cargo run --release -p monel-fabric --example plan [DESIGN.toml]

use monel_fabric::{evaluate, parse_design};

const DESIGN: &str = r#"
name = "512 GPUs, rail-optimized RoCE"
gpus = 512

[server]
gpus = 8
nics = 8

[fabric]
kind = "rail-optimized"
transport = "roce"
radix = 64
link_speed = "400Gbps"

[collective]
op = "all_reduce"
algorithm = "ring"
size = "1GiB"
"#;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (text, name) = match std::env::args().nth(1) {
        Some(path) => (std::fs::read_to_string(&path)?, path),
        None => (DESIGN.to_string(), "built-in".to_string()),
    };
    let design = parse_design(&text, &name, None)?;
    let report = evaluate(design)?;
    print!("{report}");
    Ok(())
}
