//! `monel transfer [SERVER] -s SIZE`: one verified bulk RDMA WRITE (see
//! `tools::transfer`), with goodput, the QP's recovery counters and DCQCN's reaction.

use crate::tools::transfer::{self, TransferOptions};
use anyhow::{Context as _, bail};
use clap::Args;
use monel_verbs::{AccessFlags, MemoryRegion};

use crate::connect::{self, ConnArgs};

/// Arguments of `monel transfer`.
#[derive(Debug, Args)]
pub(crate) struct TransferArgs {
    /// Server to write to; without it, act as the server (offer a region, check it).
    server: Option<String>,
    #[command(flatten)]
    conn: ConnArgs,
    /// Bytes to move (suffixes K, M, G: powers of 1024).
    #[arg(short = 's', long, default_value = "1G")]
    size: String,
    /// Bytes per WRITE (suffixes as --size).
    #[arg(long, default_value = "1M")]
    chunk: String,
    /// WRITEs in flight.
    #[arg(short = 't', long = "tx-depth", default_value_t = 16)]
    tx_depth: u32,
    /// Seed of the data pattern.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

/// Parses `1G`, `64K`, `4096`.
pub(crate) fn parse_size(s: &str) -> anyhow::Result<usize> {
    let t = s.trim();
    let (num, shift) = match t.chars().last() {
        Some('k' | 'K') => (&t[..t.len() - 1], 10),
        Some('m' | 'M') => (&t[..t.len() - 1], 20),
        Some('g' | 'G') => (&t[..t.len() - 1], 30),
        _ => (t, 0),
    };
    let n: usize = num.parse().with_context(|| format!("{s}: not a size"))?;
    let v = n
        .checked_mul(1 << shift)
        .with_context(|| format!("{s}: too large"))?;
    if v == 0 {
        bail!("{s}: a size must be positive");
    }
    Ok(v)
}

pub(crate) fn run(a: &TransferArgs) -> anyhow::Result<()> {
    let size = parse_size(&a.size)?;
    let chunk = parse_size(&a.chunk)?;
    let is_client = a.server.is_some();
    let seed = a.seed;
    let mut s = connect::open(&a.conn, a.server.as_deref(), a.tx_depth, |pd| {
        let mut buf = vec![0u8; size];
        if is_client {
            transfer::fill_pattern(&mut buf, seed);
        }
        let access = if is_client {
            AccessFlags::LOCAL_WRITE
        } else {
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE
        };
        pd.reg_mr(buf, access)
    })?;
    let mr: &MemoryRegion = &s.mr;
    if let Some(server) = &a.server {
        let remote = s.conn.remote_buf.context("server offered no region")?;
        let o = TransferOptions {
            chunk,
            depth: a.tx_depth,
            seed,
            ..TransferOptions::default()
        };
        let r = transfer::write_client(&s.qp, &s.cq, mr, remote, &mut s.conn, &o)?;
        println!(
            "transfer to {server}: {} B in {} WRITEs of {chunk} B, {:.3} s, goodput {:.2} Gb/s, CRC-32 {:08x} verified by the server",
            r.bytes,
            r.messages,
            r.seconds,
            r.gbps(),
            r.crc
        );
        // A hardware NIC keeps its recovery and congestion state to itself.
        let (Ok(st), Ok(cc)) = (s.qp.stats(), s.qp.congestion()) else {
            println!("recovery: counted by {} (monel devices)", s.dev.name);
            return Ok(());
        };
        println!(
            "recovery: {} packets sent, {} retransmitted, {} timeouts, {} sequence NAKs received, {} duplicate responses",
            st.tx_packets,
            st.retransmitted_packets,
            st.timeouts,
            st.seq_naks_received,
            st.duplicate_responses
        );
        match (r.min_rate_bps, cc.rate_bps) {
            (Some(min), Some(now)) => println!(
                "dcqcn: {} CNPs received, rate fell to {:.3} Gb/s (now {:.3} Gb/s, alpha {:.3})",
                st.cnps_received,
                min / 1e9,
                now / 1e9,
                cc.alpha.unwrap_or(0.0)
            ),
            _ => println!("dcqcn: off ({} CNPs received)", st.cnps_received),
        }
    } else {
        let crc = transfer::write_server(mr, &mut s.conn)?;
        println!(
            "transfer from {}: {size} B received, CRC-32 {crc:08x} matches the client's",
            s.conn.remote.gid.to_ip()
        );
        let Ok(st) = s.qp.stats() else {
            println!("responder: counted by {} (monel devices)", s.dev.name);
            return Ok(());
        };
        println!(
            "responder: {} packets accepted, {} out of sequence, {} duplicates, {} sequence NAKs and {} CNPs sent; device ecn_ce {}",
            st.rx_packets,
            st.out_of_sequence,
            st.duplicate_requests,
            st.seq_naks_sent,
            st.cnps_sent,
            s.ctx.counters().ecn_ce
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("1G").unwrap(), 1 << 30);
        assert_eq!(parse_size("64k").unwrap(), 65536);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert!(parse_size("0").is_err());
        assert!(parse_size("x").is_err());
        assert!(parse_size("99999999999999G").is_err());
    }
}
