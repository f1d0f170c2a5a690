//! Agreement on the cost model: every rank prices its own links, and all take the
//! slowest, so all choose the same algorithm for a call.

use monel_sched::dtype::DataType;
use monel_sched::plan::Algorithm;

use super::{CHOICES, Communicator};
use crate::error::{CclError, ErrorKind, Result};

impl Communicator {
    /// Gives every rank the same cost model, so all of them choose the same algorithm for
    /// a call. A rank prices the links it has, and ranks can see different ones (a pair that
    /// fell back from shared memory to TCP, a host with more ranks than cores); ranks that
    /// run different algorithms fail the call with a mismatch. One all-gather at init
    /// (direct, whatever the settings) of each rank's costs and of the settings that shape
    /// schedules; every rank then takes the slowest links any rank reported, and settings
    /// that differ are a [`ErrorKind::Mismatch`] naming the ranks, on every rank alike.
    pub(super) fn agree_on_tuning(&mut self) -> Result<()> {
        let n = self.nranks;
        if n == 1 {
            return Ok(());
        }
        let mine = encode(&self.cfg, &self.costs, self.hosts.as_ref());
        let mut all = vec![0u8; LEN * n];
        let algo = self.cfg.algo.replace(Algorithm::Direct);
        let deterministic = std::mem::take(&mut self.cfg.deterministic);
        let res = self.all_gather(&mine, &mut all, LEN, DataType::U8);
        self.cfg.algo = algo;
        self.cfg.deterministic = deterministic;
        res?;
        let records: Vec<Record> = all.chunks_exact(LEN).map(decode).collect();
        if let Some(e) = disagreement(&records) {
            self.failed = Some(e.clone());
            return Err(e);
        }
        let (costs, hosts) = slowest(&records, self.hosts);
        if costs != self.costs || hosts != self.hosts {
            tracing::info!(
                target: "monel::tuning",
                "rank {}: the cost model takes the slowest links any rank has \
                 ({:.1} us, {:.2} GB/s per step{}), as every rank does",
                self.rank,
                costs.alpha * 1e6,
                costs.beta / 1e9,
                hosts.map_or(String::new(), |h| format!(
                    "; inside hosts {:.1} us, {:.2} GB/s; between {:.1} us, {:.2} GB/s",
                    h.local.alpha * 1e6,
                    h.local.beta / 1e9,
                    h.net.alpha * 1e6,
                    h.net.beta / 1e9
                ))
            );
        }
        self.costs = costs;
        self.hosts = hosts;
        self.choices = [None; CHOICES];
        Ok(())
    }
}

use crate::comm::CommConfig;
use monel_sched::tune::{Costs, Hosts};

/// Bytes per rank: nine little-endian u64s.
pub(super) const LEN: usize = 72;

/// One rank's costs and schedule-shaping settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Record {
    pub(super) costs: Costs,
    /// Inside and between hosts, where the rank saw a host layout.
    pub(super) hosts: Option<(Costs, Costs)>,
    pub(super) chunk: u64,
    /// 0 when no algorithm is forced, else its [`Algorithm::code`].
    pub(super) algo: u64,
    pub(super) deterministic: u64,
}

impl Record {
    /// The settings every rank must share, by variable, as they print.
    fn settings(&self) -> [(&'static str, String); 3] {
        let algo = u8::try_from(self.algo)
            .ok()
            .and_then(Algorithm::from_code)
            .map_or("unset", Algorithm::name);
        [
            ("MONEL_ALGO", algo.to_string()),
            ("MONEL_CHUNK", self.chunk.to_string()),
            ("MONEL_DETERMINISTIC", self.deterministic.to_string()),
        ]
    }
}

pub(super) fn encode(cfg: &CommConfig, costs: &Costs, hosts: Option<&Hosts>) -> [u8; LEN] {
    let algo = cfg.algo.map_or(0, |a| u64::from(a.code()));
    // No host layout: NaN where the costs inside and between hosts go.
    let h = |f: fn(&Hosts) -> f64| hosts.map_or(f64::NAN, f).to_bits();
    let words = [
        costs.alpha.to_bits(),
        costs.beta.to_bits(),
        h(|h| h.local.alpha),
        h(|h| h.local.beta),
        h(|h| h.net.alpha),
        h(|h| h.net.beta),
        cfg.chunk as u64,
        algo,
        u64::from(cfg.deterministic),
    ];
    let mut out = [0u8; LEN];
    for (o, w) in out.chunks_exact_mut(8).zip(words) {
        o.copy_from_slice(&w.to_le_bytes());
    }
    out
}

pub(super) fn decode(b: &[u8]) -> Record {
    let w = |i: usize| u64::from_le_bytes(b[8 * i..8 * i + 8].try_into().expect("8 bytes"));
    let f = |i: usize| f64::from_bits(w(i));
    let costs = |i: usize| Costs {
        alpha: f(i),
        beta: f(i + 1),
    };
    Record {
        costs: costs(0),
        hosts: (!f(2).is_nan()).then(|| (costs(2), costs(4))),
        chunk: w(6),
        algo: w(7),
        deterministic: w(8),
    }
}

/// The error every rank reports when ranks were started with different `MONEL_ALGO`,
/// `MONEL_CHUNK` or `MONEL_DETERMINISTIC`.
pub(super) fn disagreement(records: &[Record]) -> Option<CclError> {
    let first = records.first()?.settings();
    for (k, (name, want)) in first.iter().enumerate() {
        let differ = |r: &Record| r.settings()[k].1 != *want;
        let odd: Vec<usize> = (0..records.len())
            .filter(|&j| differ(&records[j]))
            .collect();
        if let Some(&j) = odd.first() {
            return Some(
                CclError::new(
                    ErrorKind::Mismatch,
                    format!(
                        "ranks disagree on {name}: rank 0 has {want}, ranks {odd:?} differ \
                         (rank {j} has {}); every rank needs the same {name}",
                        records[j].settings()[k].1
                    ),
                )
                .with_ranks(odd),
            );
        }
    }
    None
}

/// The slowest costs any rank reported: the largest latency and the smallest bandwidth,
/// for the flat links and for the links inside and between hosts.
pub(super) fn slowest(records: &[Record], hosts: Option<Hosts>) -> (Costs, Option<Hosts>) {
    let worse = |a: Costs, b: Costs| Costs {
        alpha: a.alpha.max(b.alpha),
        beta: a.beta.min(b.beta),
    };
    let flat = records.iter().map(|r| r.costs).reduce(worse);
    let hosts = hosts.map(|mut h| {
        for (local, net) in records.iter().filter_map(|r| r.hosts) {
            h.local = worse(h.local, local);
            h.net = worse(h.net, net);
        }
        h
    });
    (flat.unwrap_or(Costs::SHM), hosts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::config::with;

    #[test]
    fn tuning_records_round_trip_and_agree_on_the_slowest_links() {
        let cfg = with(&[("MONEL_ALGO", "tree"), ("MONEL_CHUNK", "65536")]).unwrap();
        let hosts = Hosts {
            per_host: 2,
            local: Costs::SHM,
            net: Costs::ROCE,
        };
        let a = decode(&encode(&cfg, &Costs::SHM, Some(&hosts)));
        assert_eq!(a.costs, Costs::SHM);
        assert_eq!(a.hosts, Some((Costs::SHM, Costs::ROCE)));
        assert_eq!((a.chunk, a.deterministic), (65536, 0));
        let b = decode(&encode(&CommConfig::default(), &Costs::TCP, None));
        assert_eq!((b.costs, b.hosts), (Costs::TCP, None));
        // The slowest of each: TCP's latency and bandwidth flat; inside hosts, where only
        // one rank reported, its costs.
        let mut c = a;
        c.hosts = Some((Costs::TCP, Costs::ROCE));
        let (flat, h) = slowest(&[a, b, c], Some(hosts));
        assert_eq!(flat, Costs::TCP);
        let h = h.unwrap();
        assert_eq!((h.per_host, h.local, h.net), (2, Costs::TCP, Costs::ROCE));
        // Settings: the first that differs is named, with the odd ranks.
        let e = disagreement(&[a, a, b]).unwrap();
        assert_eq!(e.ranks, vec![2]);
        assert!(e.message.contains("MONEL_ALGO: rank 0 has tree"), "{e}");
        assert!(e.message.contains("rank 2 has unset"), "{e}");
        assert!(disagreement(&[a, c]).is_none());
    }
}
