//! Runs every rank's schedule in memory, with unbounded FIFO links between each pair of ranks:
//! the reference executor the property tests check the algorithms with, no network involved.

use std::collections::{HashMap, VecDeque};

use crate::buffers::Buffers;
use crate::error::{Result, SchedError};
use crate::schedule::{Op, Schedule};

/// Runs `schedules[r]` on `bufs[r]` for every rank until all finish. Fails on a message of
/// the wrong length, or when no rank can make progress (a deadlock in the schedules).
pub fn run(schedules: &[Schedule], bufs: &mut [Buffers<'_>]) -> Result<()> {
    let n = schedules.len();
    for (s, b) in schedules.iter().zip(bufs.iter_mut()) {
        b.reserve_scratch(s.scratch);
    }
    let mut links: HashMap<(usize, usize), VecDeque<Vec<u8>>> = HashMap::new();
    let mut pc = vec![0usize; n];
    let mut pending: Vec<Option<Vec<usize>>> = vec![None; n];
    loop {
        let mut progress = false;
        let mut done = 0;
        for r in 0..n {
            let Some(step) = schedules[r].steps.get(pc[r]) else {
                done += 1;
                continue;
            };
            if pending[r].is_none() {
                for op in &step.ops {
                    match *op {
                        Op::Copy { src, dst } => bufs[r].copy(src, dst)?,
                        Op::Reduce { src, dst } => bufs[r].reduce(src, dst)?,
                        Op::Divide { dst } => bufs[r].divide(dst)?,
                        _ => {}
                    }
                }
                for op in &step.ops {
                    if let Op::Send { peer, src } = *op {
                        let data = bufs[r].bytes(src)?.to_vec();
                        links.entry((r, peer)).or_default().push_back(data);
                    }
                }
                let recvs = (0..step.ops.len())
                    .filter(|&i| matches!(step.ops[i], Op::Recv { .. } | Op::RecvReduce { .. }))
                    .collect();
                pending[r] = Some(recvs);
                progress = true;
            }
            let waiting = pending[r].as_mut().expect("started");
            let mut seen = Vec::new();
            let mut i = 0;
            while i < waiting.len() {
                let (peer, dst, acc) = match step.ops[waiting[i]] {
                    Op::Recv { peer, dst, reduce } => (peer, dst, reduce.then_some(dst)),
                    Op::RecvReduce { peer, acc, dst } => (peer, dst, Some(acc)),
                    _ => unreachable!("receives only"),
                };
                // Messages from one peer match receives in posting order.
                if seen.contains(&peer) {
                    i += 1;
                    continue;
                }
                seen.push(peer);
                if let Some(msg) = links.get_mut(&(peer, r)).and_then(VecDeque::pop_front) {
                    match acc {
                        Some(acc) => bufs[r].land_onto(acc, dst, &msg)?,
                        None => bufs[r].land(dst, &msg, false)?,
                    }
                    waiting.remove(i);
                    progress = true;
                } else {
                    i += 1;
                }
            }
            if waiting.is_empty() {
                pending[r] = None;
                pc[r] += 1;
                progress = true;
            }
        }
        if done == n {
            return Ok(());
        }
        if !progress {
            return Err(SchedError::internal(format!(
                "schedules deadlock at steps {pc:?}"
            )));
        }
    }
}
