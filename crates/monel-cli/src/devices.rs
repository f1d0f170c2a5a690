//! `monel devices`: like `ibv_devinfo -v`, for the kernel's RDMA devices (through
//! rdma-core) and Monel's soft devices.

use clap::Args;
use monel_verbs::{Device, Provider, devices};

/// Arguments of `monel devices`.
#[derive(Debug, Args)]
pub(crate) struct DevicesArgs {
    /// Only this device (`rxe0`, `mlx5_0:2`, `monel_eth0` or `eth0`).
    #[arg(short = 'd', long = "ib-dev")]
    device: Option<String>,
}

fn print(d: &Device) {
    let p = d.port_attr();
    println!("hca_id:\t{}", d.name);
    let port = match d.provider {
        Provider::Soft => {
            println!("\ttransport:\t\tRoCEv2 over UDP (Monel soft RNIC)");
            1
        }
        Provider::RdmaCore { port, .. } => {
            println!("\ttransport:\t\tInfiniBand verbs (rdma-core libibverbs)");
            port
        }
    };
    println!("\tnetdev:\t\t\t{}", d.ifname);
    let g = d.node_guid.to_be_bytes();
    println!(
        "\tnode_guid:\t\t{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}",
        g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7]
    );
    println!("\t\tport:\t{port}");
    println!("\t\t\tstate:\t\t\t{:?} ({})", p.state, p.state as u32);
    println!(
        "\t\t\tmax_mtu:\t\t{} ({})",
        p.max_mtu.bytes(),
        p.max_mtu as u32
    );
    println!(
        "\t\t\tactive_mtu:\t\t{} ({})",
        p.active_mtu.bytes(),
        p.active_mtu as u32
    );
    println!("\t\t\tlink_layer:\t\tEthernet (IP MTU {})", p.link_mtu);
    for s in d.gid_slots() {
        println!(
            "\t\t\tGID[{:3}]:\t\t{}, {} ({})",
            s.index,
            s.gid,
            s.kind,
            s.gid.to_ip()
        );
    }
}

pub(crate) fn run(a: &DevicesArgs) -> anyhow::Result<()> {
    match &a.device {
        Some(n) => print(&Device::by_name(n)?),
        None => {
            for d in devices()? {
                print(&d);
            }
        }
    }
    Ok(())
}
