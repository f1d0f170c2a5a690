//! `monel dump`: decode a capture and check every ICRC (tshark decodes RoCE but never checks
//! the ICRC).

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use monel_wire::pcap::PcapReader;
use monel_wire::{IpFrame, ROCE_V2_UDP_PORT, WireError};

#[derive(Debug, Args)]
pub(crate) struct DumpArgs {
    /// The pcap file (Ethernet or raw IP link type).
    file: PathBuf,
    /// UDP port RoCEv2 runs on.
    #[arg(long, default_value_t = ROCE_V2_UDP_PORT)]
    port: u16,
    /// Print only the summary.
    #[arg(short, long)]
    quiet: bool,
}

pub(crate) fn run(a: &DumpArgs) -> anyhow::Result<()> {
    let data = std::fs::read(&a.file).with_context(|| format!("reading {}", a.file.display()))?;
    let reader =
        PcapReader::new(&data).map_err(|e| anyhow::anyhow!("{}: {e}", a.file.display()))?;
    let (mut records, mut roce, mut bad_icrc, mut malformed) = (0u64, 0u64, 0u64, 0u64);
    let mut first_ts = None;
    for rec in reader.clone() {
        let rec =
            rec.map_err(|e| anyhow::anyhow!("{}: record {}: {e}", a.file.display(), records + 1))?;
        records += 1;
        let t0 = *first_ts.get_or_insert(rec.timestamp_ns);
        let Ok(ip) = reader.ip_payload(&rec) else {
            continue;
        };
        let frame = match IpFrame::parse(ip) {
            Ok(f) if f.udp().dst_port() == a.port => f,
            Ok(_) => continue,
            Err(WireError::NotUdp | WireError::BadIpVersion(_)) => continue,
            Err(e) => {
                if looks_like_roce(ip, a.port) {
                    malformed += 1;
                    if !a.quiet {
                        println!("{records:>6} malformed RoCEv2 packet: {e}");
                    }
                }
                continue;
            }
        };
        roce += 1;
        let icrc = match frame.check_icrc() {
            Ok(()) => "icrc ok".to_string(),
            Err(e) => {
                bad_icrc += 1;
                e.to_string()
            }
        };
        if !a.quiet {
            let t = (rec.timestamp_ns - t0) as f64 / 1e9;
            println!(
                "{records:>6} {t:>12.6} {} > {} {} [{icrc}]",
                frame.src(),
                frame.dst(),
                frame.roce()
            );
        }
    }
    println!(
        "{records} records, {roce} RoCEv2 packets, {bad_icrc} bad ICRC, {malformed} malformed"
    );
    if bad_icrc > 0 || malformed > 0 {
        std::process::exit(1);
    }
    Ok(())
}

/// A UDP datagram to the RoCE port that failed to parse further.
fn looks_like_roce(ip: &[u8], port: u16) -> bool {
    let off = match ip.first().map(|b| b >> 4) {
        Some(4) => 20,
        Some(6) => 40,
        _ => return false,
    };
    ip.len() >= off + 4 && u16::from_be_bytes([ip[off + 2], ip[off + 3]]) == port
}
