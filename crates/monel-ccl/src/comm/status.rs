//! The status endpoint: what this rank is doing, served to peers that time out waiting
//! for it, so an error can name the ranks that are missing and where they are.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use super::{Communicator, describe_sig};
use crate::error::{CclError, ErrorKind};
use crate::exec;
use crate::frame::Signature;

/// What this rank is doing, for the status endpoint.
pub(super) struct Status {
    pub(super) seq: u64,
    /// The current (or last) collective; `None` before the first.
    pub(super) sig: Option<Signature>,
    pub(super) state: &'static str,
}

/// Answers status queries with `seq <n> <state> <what>` until `stop`.
pub(super) fn serve_status(l: TcpListener, status: Arc<Mutex<Status>>, stop: Arc<AtomicBool>) {
    let _ = std::thread::Builder::new()
        .name("monel-status".into())
        .spawn(move || {
            for c in l.incoming() {
                if stop.load(Ordering::Acquire) {
                    return;
                }
                let Ok(mut s) = c else { continue };
                let line = {
                    let st = status.lock().unwrap_or_else(PoisonError::into_inner);
                    let what = st.sig.as_ref().map_or_else(|| "init".into(), describe_sig);
                    format!("seq {} {} {what}\n", st.seq, st.state)
                };
                let _ = s.write_all(line.as_bytes());
            }
        });
}

pub(super) fn query_status(addr: SocketAddr) -> Result<(u64, String), String> {
    let mut s =
        TcpStream::connect_timeout(&addr, Duration::from_millis(500)).map_err(|e| e.to_string())?;
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    let mut line = String::new();
    s.read_to_string(&mut line).map_err(|e| e.to_string())?;
    let rest = line.trim().strip_prefix("seq ").ok_or("garbled status")?;
    let (n, text) = rest.split_once(' ').ok_or("garbled status")?;
    Ok((n.parse().map_err(|_| "garbled status")?, text.to_string()))
}

impl Communicator {
    /// Turns a timeout into an error naming every rank that is not in this collective, with
    /// the operation it was last seen in (from each rank's status endpoint).
    pub(super) fn name_missing(&self, what: &str, e: CclError) -> CclError {
        let mut missing = Vec::new();
        let mut notes = Vec::new();
        for (j, p) in self.table.iter().enumerate() {
            if j == self.rank {
                continue;
            }
            match query_status(p.status) {
                Ok((seq, text)) if seq < self.seq => {
                    missing.push(j);
                    let (state, op) = text.split_once(' ').unwrap_or((text.as_str(), ""));
                    notes.push(format!("rank {j} last seen in {op} ({state})"));
                }
                Ok(_) => {}
                // Gone, but it told us it reached this collective and gave up too.
                Err(_) if exec::gave_up_in(&self.links, j, self.seq) => {}
                Err(why) => {
                    missing.push(j);
                    notes.push(format!("rank {j} unreachable ({why}): dead?"));
                }
            }
        }
        if missing.is_empty() {
            return CclError::new(
                ErrorKind::Timeout,
                format!("{}; every rank is in it ({})", e.message, what),
            )
            .with_ranks(e.ranks);
        }
        CclError::new(
            ErrorKind::Timeout,
            format!(
                "{what}: timed out after {:.1} s; ranks {missing:?} never arrived: {}",
                self.cfg.timeout.as_secs_f64(),
                notes.join("; ")
            ),
        )
        .with_ranks(missing)
    }
}
