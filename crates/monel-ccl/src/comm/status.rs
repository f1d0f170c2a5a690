//! The status endpoint: what this rank is doing, served to peers that time out waiting
//! for it, so an error can name the ranks that are missing and where they are.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use monel_peer::auth::{Key, nonce};
use monel_peer::greeter::Greeter;

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

/// How long a status query may take to prove the job key.
const QUERY_TIME: Duration = Duration::from_millis(500);

/// Answers status queries that prove the job key `key` (a challenge, then HMAC("status",
/// challenge)) with `seq <n> <state> <what>` until `stop`. Every query is read on its own,
/// so a silent one delays no rank's liveness probe; one without the key learns nothing.
pub(super) fn serve_status(
    l: TcpListener,
    status: Arc<Mutex<Status>>,
    stop: Arc<AtomicBool>,
    key: Key,
) {
    let answer = move |s: &mut TcpStream| -> std::io::Result<()> {
        let challenge = nonce();
        s.write_all(&challenge)?;
        let mut proof = [0u8; 32];
        s.read_exact(&mut proof)?;
        if !key.verify(&[b"status", &challenge], &proof) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                "could not prove the job key",
            ));
        }
        let line = {
            let st = status.lock().unwrap_or_else(PoisonError::into_inner);
            let what = st.sig.as_ref().map_or_else(|| "init".into(), describe_sig);
            format!("seq {} {} {what}\n", st.seq, st.state)
        };
        s.write_all(line.as_bytes())
    };
    let _ = std::thread::Builder::new()
        .name("monel-status".into())
        .spawn(move || {
            let Ok(mut greeter) = Greeter::new(l, answer, QUERY_TIME, "status") else {
                return;
            };
            while !stop.load(Ordering::Acquire) {
                if greeter.next(Duration::from_millis(200)).is_err() {
                    return;
                }
            }
        });
}

/// Asks the status endpoint at `addr`, proving the job key.
pub(super) fn query_status(addr: SocketAddr, key: &Key) -> Result<(u64, String), String> {
    let mut s = TcpStream::connect_timeout(&addr, QUERY_TIME).map_err(|e| e.to_string())?;
    let _ = s.set_read_timeout(Some(QUERY_TIME));
    let mut challenge = [0u8; 16];
    s.read_exact(&mut challenge).map_err(|e| e.to_string())?;
    s.write_all(&key.prove(&[b"status", &challenge]))
        .map_err(|e| e.to_string())?;
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
            match query_status(p.status, &self.key) {
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
                "{what}: Timed out after {:.1} s; ranks {missing:?} never arrived: {}",
                self.cfg.timeout.as_secs_f64(),
                notes.join("; ")
            ),
        )
        .with_ranks(missing)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A query that cannot prove the job key learns nothing, and a silent connection held
    /// open delays no rank's query.
    #[test]
    fn the_status_endpoint_answers_only_the_job_and_no_one_stalls_it() {
        let key = Key::from_secret(b"job key");
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let at = l.local_addr().unwrap();
        let status = Arc::new(Mutex::new(Status {
            seq: 41,
            sig: None,
            state: "running",
        }));
        let stop = Arc::new(AtomicBool::new(false));
        serve_status(l, status, stop.clone(), key.clone());
        let _silent = TcpStream::connect(at).unwrap();
        let e = query_status(at, &Key::from_secret(b"guess")).unwrap_err();
        assert!(!e.contains("seq"), "{e}");
        // The query gives up after 500 ms: behind the silent connection it would fail.
        let (seq, text) = query_status(at, &key).unwrap();
        assert_eq!((seq, text.as_str()), (41, "running init"));
        stop.store(true, Ordering::Release);
    }
}
