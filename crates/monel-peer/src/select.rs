//! Which transport a peer gets: the first of shared memory, RDMA and TCP that both ends can
//! use, with one log line saying which and why the faster ones were not taken.
//!
//! Collectives set every pair of a communicator up at once, a transport at a time (each
//! transport's handshake runs over all the pairs still waiting); transfers set one peer up at
//! a time. Both keep a [`Selection`] per peer, and both end it the same way, so a user reads
//! one form of line from either:
//!
//! ```text
//! rank 0 -> 1 via SHM 4 MiB ring
//! rank 0 -> 2 via TCP 10.0.0.1 -> 10.0.0.2:41000 (congestion cubic; not SHM: another host; not RDMA: no RoCE device)
//! ```

use std::fmt::{self, Display};

pub use monel_sched::tune::TransportKind;

/// The order transports are tried in: the fastest first.
pub const ORDER: [TransportKind; 3] = [TransportKind::Shm, TransportKind::Roce, TransportKind::Tcp];

/// How a line names a transport that declined a peer.
const fn declined_name(kind: TransportKind) -> &'static str {
    match kind {
        TransportKind::Shm => "SHM",
        TransportKind::Roce => "RDMA",
        TransportKind::Tcp => "TCP",
    }
}

/// One peer's way down [`ORDER`]: the transports that declined it, each with its reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selection {
    from: String,
    to: String,
    declined: Vec<(TransportKind, String)>,
}

impl Selection {
    /// The selection for the link from `from` (this side, as the log names it) to `to`.
    pub fn new(from: impl Display, to: impl Display) -> Self {
        Self {
            from: from.to_string(),
            to: to.to_string(),
            declined: Vec::new(),
        }
    }

    /// Records that `kind` did not take the peer, and why.
    pub fn decline(&mut self, kind: TransportKind, why: impl Display) {
        self.declined.push((kind, why.to_string()));
    }

    /// The transports that declined, in order, with their reasons.
    pub fn declined(&self) -> &[(TransportKind, String)] {
        &self.declined
    }

    /// Why every transport tried so far declined: `not SHM: ...; not RDMA: ...`.
    pub fn reasons(&self) -> String {
        self.declined
            .iter()
            .map(|(k, why)| format!("not {}: {why}", declined_name(*k)))
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// The log line for the transport chosen: `FROM -> TO via KIND DETAIL (NOTES; REASONS)`,
    /// where `notes` say how the transport was set up and the reasons why faster ones were
    /// not taken.
    pub fn chosen(&self, kind: TransportKind, detail: &str, notes: &[String]) -> String {
        let mut s = format!("{} -> {} via {kind}", self.from, self.to);
        if !detail.is_empty() {
            s.push(' ');
            s.push_str(detail);
        }
        let mut all = notes.join("; ");
        if !self.declined.is_empty() {
            if !all.is_empty() {
                all.push_str("; ");
            }
            all.push_str(&self.reasons());
        }
        if !all.is_empty() {
            s.push_str(&format!(" ({all})"));
        }
        s
    }
}

/// What one transport made of one peer.
#[derive(Debug)]
pub enum Attempt<T> {
    /// The transport took the peer: its link, and a description for the log line.
    Up(T, String),
    /// The transport did not take the peer, for this reason; the next one is tried.
    Declined(String),
}

/// A peer that no transport of the order took.
#[derive(Debug)]
pub struct NoTransport {
    /// The selection, with every transport's reason.
    pub selection: Selection,
}

impl Display for NoTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} -> {}: no transport took the peer ({})",
            self.selection.from,
            self.selection.to,
            self.selection.reasons()
        )
    }
}

impl std::error::Error for NoTransport {}

/// The chosen transport of one peer: its kind, its link and the log line.
#[derive(Debug)]
pub struct Chosen<T> {
    /// The transport.
    pub kind: TransportKind,
    /// What the transport made.
    pub link: T,
    /// The log line ([`Selection::chosen`]).
    pub line: String,
}

/// Tries the transports of `order` on one peer in turn: the first whose `attempt` comes
/// [`Attempt::Up`] is chosen; a peer that every transport declined is [`NoTransport`].
pub fn select<T>(
    mut selection: Selection,
    order: &[TransportKind],
    mut attempt: impl FnMut(TransportKind) -> Attempt<T>,
) -> Result<Chosen<T>, NoTransport> {
    for &kind in order {
        match attempt(kind) {
            Attempt::Up(link, detail) => {
                let line = selection.chosen(kind, &detail, &[]);
                return Ok(Chosen { kind, link, line });
            }
            Attempt::Declined(why) => selection.decline(kind, why),
        }
    }
    Err(NoTransport { selection })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_name_the_transport_and_every_reason() {
        let mut s = Selection::new("rank 0", 2);
        assert_eq!(s.chosen(TransportKind::Shm, "", &[]), "rank 0 -> 2 via SHM");
        s.decline(TransportKind::Shm, "another host");
        s.decline(TransportKind::Roce, "no RoCE device");
        assert_eq!(
            s.chosen(TransportKind::Tcp, "a -> b", &["congestion cubic".into()]),
            "rank 0 -> 2 via TCP a -> b (congestion cubic; not SHM: another host; not RDMA: \
             no RoCE device)"
        );
        assert_eq!(
            s.reasons(),
            "not SHM: another host; not RDMA: no RoCE device"
        );
    }

    #[test]
    fn select_takes_the_first_that_comes_up_and_keeps_the_reasons() {
        let mut tried = Vec::new();
        let got = select(Selection::new("me", "you"), &ORDER, |k| {
            tried.push(k);
            match k {
                TransportKind::Shm => Attempt::Declined("another host".into()),
                _ => Attempt::Up(k, "up".into()),
            }
        })
        .unwrap();
        assert_eq!(tried, [TransportKind::Shm, TransportKind::Roce]);
        assert_eq!(got.kind, TransportKind::Roce);
        assert_eq!(got.line, "me -> you via RoCE up (not SHM: another host)");
    }

    #[test]
    fn a_peer_nobody_takes_is_named_with_every_reason() {
        let none = select(Selection::new("me", "you"), &ORDER, |k| {
            Attempt::<()>::Declined(format!("no {k}"))
        })
        .unwrap_err();
        assert_eq!(
            none.to_string(),
            "me -> you: no transport took the peer (not SHM: no SHM; not RDMA: no RoCE; not \
             TCP: no TCP)"
        );
        assert_eq!(none.selection.declined().len(), 3);
    }
}
