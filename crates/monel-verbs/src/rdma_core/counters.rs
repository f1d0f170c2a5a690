//! A kernel RDMA port's counters, read from sysfs into Monel's [`DeviceCounters`]: the
//! InfiniBand port counters where the driver has them (`counters/port_*`, data in 4-byte
//! words), else the driver's own (`hw_counters/`, as rxe: `sent_pkts`, `rcvd_pkts`, ...).

use std::path::{Path, PathBuf};

use super::sysfs::SYSFS_ROOT;
use crate::counters::DeviceCounters;
use crate::device::{Device, Provider};

fn read(dir: &Path, leaf: &str) -> Option<u64> {
    std::fs::read_to_string(dir.join(leaf))
        .ok()?
        .trim()
        .parse()
        .ok()
}

fn port_dir(device: &Device) -> Option<PathBuf> {
    let Provider::RdmaCore { port, .. } = device.provider else {
        return None;
    };
    let name = device.name.split(':').next()?;
    Some(
        Path::new(SYSFS_ROOT)
            .join(name)
            .join(format!("ports/{port}")),
    )
}

/// The port's counters as of now (zero where the driver keeps none).
pub(crate) fn read_port(device: &Device) -> DeviceCounters {
    let mut c = DeviceCounters::default();
    let Some(dir) = port_dir(device) else {
        return c;
    };
    let pma = dir.join("counters");
    let hw = dir.join("hw_counters");
    c.rx_packets = read(&pma, "port_rcv_packets")
        .or_else(|| read(&hw, "rcvd_pkts"))
        .unwrap_or(0);
    c.tx_packets = read(&pma, "port_xmit_packets")
        .or_else(|| read(&hw, "sent_pkts"))
        .unwrap_or(0);
    c.rx_bytes = read(&pma, "port_rcv_data").map_or(0, |w| w * 4);
    c.tx_bytes = read(&pma, "port_xmit_data").map_or(0, |w| w * 4);
    c.tx_errors = read(&hw, "send_err").unwrap_or(0);
    c.qp.duplicate_requests = read(&hw, "duplicate_request").unwrap_or(0);
    c.qp.rnr_naks_received = read(&hw, "rcvd_rnr_err").unwrap_or(0);
    c.qp.rnr_naks_sent = read(&hw, "send_rnr_err").unwrap_or(0);
    c.qp.seq_naks_received = read(&hw, "rcvd_seq_err").unwrap_or(0);
    c.qp.out_of_sequence = read(&hw, "out_of_seq_request").unwrap_or(0);
    c.qp.timeouts = read(&hw, "completer_retry_err").unwrap_or(0);
    c
}
