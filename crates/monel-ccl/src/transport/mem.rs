//! A link between two threads of one process through memory: a bounded byte queue each way
//! and an eventfd per end to sleep on. It stands in for shared memory (its kind is
//! [`TransportKind::Shm`], and it has the ring links' whole writes and in-place reads), so the
//! executor, the windows and the tiny path run over it without sockets or processes: the
//! seeded harness of the communicator's tests.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Mutex, PoisonError};

use monel_sched::tune::TransportKind;
use nix::poll::PollFlags;
use nix::sys::eventfd::{EfdFlags, EventFd};

use super::Link;

/// One direction: the bytes written and not yet read, and whether either end is gone.
#[derive(Default)]
struct Queue {
    bytes: VecDeque<u8>,
    closed: bool,
}

/// What both ends share: a queue each way, and each end's wake-up.
struct Pair {
    /// `queues[k]`: the bytes end `k` reads.
    queues: [Mutex<Queue>; 2],
    /// `wake[k]`: signalled when end `k` may read or write again.
    wake: [EventFd; 2],
    cap: usize,
}

impl Pair {
    fn queue(&self, k: usize) -> std::sync::MutexGuard<'_, Queue> {
        self.queues[k]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn signal(&self, k: usize) {
        // A counter that is already set wakes all the same: a failed write loses nothing.
        let _ = self.wake[k].write(1);
    }
}

/// One end of an in-memory link.
pub(crate) struct MemLink {
    pair: Arc<Pair>,
    /// This end's number: it reads `queues[me]`, writes `queues[1 - me]`.
    me: usize,
}

/// Both ends of a link whose queues hold `cap` bytes each way.
pub(crate) fn pair(cap: usize) -> io::Result<(MemLink, MemLink)> {
    let efd = || EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC);
    let pair = Arc::new(Pair {
        queues: [Mutex::default(), Mutex::default()],
        wake: [efd()?, efd()?],
        cap: cap.max(1),
    });
    Ok((
        MemLink {
            pair: pair.clone(),
            me: 0,
        },
        MemLink { pair, me: 1 },
    ))
}

/// One rank's links, by peer (`None` for itself).
pub(crate) type RankLinks = Vec<Option<Box<dyn Link>>>;

/// Links between every pair of `n` ranks: `mesh(n)[r][j]` is rank `r`'s end to rank `j`.
pub(crate) fn mesh(n: usize, cap: usize) -> io::Result<Vec<RankLinks>> {
    let mut all: Vec<RankLinks> = (0..n).map(|_| (0..n).map(|_| None).collect()).collect();
    #[allow(clippy::needless_range_loop)] // both ends of each pair, by rank
    for r in 0..n {
        for j in r + 1..n {
            let (a, b) = pair(cap)?;
            all[r][j] = Some(Box::new(a));
            all[j][r] = Some(Box::new(b));
        }
    }
    Ok(all)
}

impl MemLink {
    fn peer(&self) -> usize {
        1 - self.me
    }

    /// Writes what fits of `parts`, in order; `whole`: all or nothing.
    fn write_parts(&mut self, parts: &[&[u8]], whole: bool) -> io::Result<usize> {
        let total: usize = parts.iter().map(|p| p.len()).sum();
        let mut q = self.pair.queue(self.peer());
        if q.closed {
            return Err(io::ErrorKind::BrokenPipe.into());
        }
        let room = self.pair.cap.saturating_sub(q.bytes.len());
        if whole && room < total {
            return Ok(0);
        }
        let mut n = 0;
        for p in parts {
            let take = p.len().min(room - n);
            q.bytes.extend(&p[..take]);
            n += take;
            if take < p.len() {
                break;
            }
        }
        drop(q);
        if n > 0 {
            self.pair.signal(self.peer());
        }
        Ok(n)
    }
}

impl Link for MemLink {
    fn kind(&self) -> TransportKind {
        TransportKind::Shm
    }

    fn write_some(&mut self, data: &[u8]) -> io::Result<usize> {
        self.write_parts(&[data], false)
    }

    fn write_two(&mut self, a: &[u8], b: &[u8]) -> io::Result<usize> {
        self.write_parts(&[a, b], false)
    }

    fn write_whole(&mut self, a: &[u8], b: &[u8]) -> io::Result<bool> {
        Ok(self.write_parts(&[a, b], true)? > 0 || a.is_empty() && b.is_empty())
    }

    fn read_some(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut q = self.pair.queue(self.me);
        if q.bytes.is_empty() {
            return if q.closed {
                Err(io::ErrorKind::UnexpectedEof.into())
            } else {
                Ok(0)
            };
        }
        let n = buf.len().min(q.bytes.len());
        for (d, s) in buf.iter_mut().zip(q.bytes.drain(..n)) {
            *d = s;
        }
        drop(q);
        self.pair.signal(self.peer());
        Ok(n)
    }

    fn peek(&self, buf: &mut [u8]) -> io::Result<usize> {
        let q = self.pair.queue(self.me);
        if q.bytes.is_empty() && q.closed {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let n = buf.len().min(q.bytes.len());
        for (d, s) in buf.iter_mut().zip(q.bytes.iter()) {
            *d = *s;
        }
        Ok(n)
    }

    fn read_in_place(
        &mut self,
        max: usize,
        f: &mut dyn FnMut(&[u8]) -> usize,
    ) -> Option<io::Result<usize>> {
        let mut q = self.pair.queue(self.me);
        if q.bytes.is_empty() {
            return Some(if q.closed {
                Err(io::ErrorKind::UnexpectedEof.into())
            } else {
                Ok(0)
            });
        }
        let have = q.bytes.make_contiguous();
        let used = f(&have[..max.min(have.len())]);
        q.bytes.drain(..used);
        drop(q);
        if used > 0 {
            self.pair.signal(self.peer());
        }
        Some(Ok(used))
    }

    fn fd(&self) -> RawFd {
        self.pair.wake[self.me].as_raw_fd()
    }

    fn arm(&mut self, read: bool, write: bool) -> Option<PollFlags> {
        // Take the pending wake-up first, then look: a write that lands after the look
        // signals again.
        let _ = self.pair.wake[self.me].read();
        let readable = {
            let q = self.pair.queue(self.me);
            !q.bytes.is_empty() || q.closed
        };
        let writable = {
            let q = self.pair.queue(self.peer());
            q.bytes.len() < self.pair.cap || q.closed
        };
        if (read && readable) || (write && writable) {
            return None;
        }
        Some(PollFlags::POLLIN)
    }
}

impl Drop for MemLink {
    fn drop(&mut self) {
        for k in [self.me, self.peer()] {
            self.pair.queue(k).closed = true;
        }
        self.pair.signal(self.peer());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_cross_in_order_within_the_bound_and_a_dropped_end_is_seen() {
        let (mut a, mut b) = pair(8).unwrap();
        assert_eq!(a.write_some(b"0123456789").unwrap(), 8);
        assert!(!a.write_whole(b"x", b"").unwrap(), "full: nothing written");
        assert_eq!(
            a.arm(false, true),
            Some(PollFlags::POLLIN),
            "nothing to do: sleep"
        );
        let mut buf = [0u8; 5];
        assert_eq!(b.peek(&mut buf).unwrap(), 5);
        assert_eq!(b.read_some(&mut buf).unwrap(), 5);
        assert_eq!(&buf, b"01234");
        assert_eq!(a.arm(false, true), None, "room again");
        let got = b.read_in_place(2, &mut |s| {
            assert_eq!(s, b"56");
            s.len()
        });
        assert_eq!(got.unwrap().unwrap(), 2);
        assert!(a.write_whole(b"ab", b"cd").unwrap());
        drop(a);
        let mut rest = [0u8; 8];
        assert_eq!(
            b.read_some(&mut rest).unwrap(),
            5,
            "what was written stays readable"
        );
        assert_eq!(&rest[..5], b"7abcd");
        assert_eq!(
            b.read_some(&mut rest).unwrap_err().kind(),
            io::ErrorKind::UnexpectedEof
        );
        assert_eq!(
            b.write_some(b"x").unwrap_err().kind(),
            io::ErrorKind::BrokenPipe
        );
    }
}
