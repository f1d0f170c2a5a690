//! Notifications: the small message a batch's initiator sends once the batch's data is in
//! place, so the consumer learns that blocks arrived (NIXL's notifications; Mooncake's
//! completion polling on the target). Each sender numbers its own from 1; the receiver takes
//! each number once, in order, and refuses a repeated or older one.

use std::collections::{HashMap, VecDeque};

use crate::batch::MAX_NOTIFICATION;
use crate::error::{Result, XferError};

/// Most senders whose numbering an inbox remembers.
pub const MAX_SENDERS: usize = 1 << 16;
/// Notifications an inbox holds before refusing more (the consumer is not reading).
pub const MAX_UNREAD: usize = 1 << 16;

/// A notification as the consumer reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notification {
    /// The sending agent's name.
    pub from: String,
    /// Its number from that sender.
    pub seq: u64,
    /// What it says.
    pub payload: Vec<u8>,
}

/// Numbers a sender's notifications.
#[derive(Debug, Default)]
pub struct Outbox {
    last: u64,
}

impl Outbox {
    /// The next number (from 1).
    pub fn next_seq(&mut self) -> u64 {
        self.last += 1;
        self.last
    }
}

/// What an agent received and its consumer has not read yet.
#[derive(Debug, Default)]
pub struct Inbox {
    last: HashMap<String, u64>,
    unread: VecDeque<Notification>,
}

impl Inbox {
    /// An empty inbox.
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes `from`'s notification `seq`: refused if that sender's number is not past the
    /// last taken, the payload is over bound, or the inbox is full.
    pub fn accept(&mut self, from: &str, seq: u64, payload: Vec<u8>) -> Result<()> {
        if payload.len() > MAX_NOTIFICATION {
            return Err(XferError::TooLarge(format!(
                "a notification of {} bytes",
                payload.len()
            )));
        }
        let last = self.last.get(from).copied().unwrap_or(0);
        if seq <= last {
            return Err(XferError::DuplicateNotification {
                from: from.to_string(),
                seq,
            });
        }
        if self.unread.len() >= MAX_UNREAD
            || (!self.last.contains_key(from) && self.last.len() >= MAX_SENDERS)
        {
            return Err(XferError::TooLarge(format!(
                "the inbox is full ({MAX_UNREAD} unread): read notifications"
            )));
        }
        self.last.insert(from.to_string(), seq);
        self.unread.push_back(Notification {
            from: from.to_string(),
            seq,
            payload,
        });
        Ok(())
    }

    /// Forgets a peer that left (a new agent of the same name numbers from 1 again).
    pub fn forget(&mut self, from: &str) {
        self.last.remove(from);
    }

    /// Unread notifications.
    pub fn unread(&self) -> usize {
        self.unread.len()
    }

    /// The unread notifications, oldest first.
    pub fn take_all(&mut self) -> Vec<Notification> {
        self.unread.drain(..).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_number_is_taken_once_in_order_per_sender() {
        let mut out = Outbox::default();
        let (a, b) = (out.next_seq(), out.next_seq());
        assert_eq!((a, b), (1, 2));
        let mut inbox = Inbox::new();
        inbox.accept("prefill-0", 1, b"req 1".to_vec()).unwrap();
        inbox.accept("prefill-1", 1, b"req 9".to_vec()).unwrap();
        assert_eq!(
            inbox.accept("prefill-0", 1, vec![]),
            Err(XferError::DuplicateNotification {
                from: "prefill-0".into(),
                seq: 1
            })
        );
        inbox.accept("prefill-0", 3, b"req 3".to_vec()).unwrap();
        assert!(inbox.accept("prefill-0", 2, vec![]).is_err(), "older");
        let got = inbox.take_all();
        assert_eq!(
            got.iter()
                .map(|n| (n.from.as_str(), n.seq))
                .collect::<Vec<_>>(),
            [("prefill-0", 1), ("prefill-1", 1), ("prefill-0", 3)]
        );
        assert!(inbox.take_all().is_empty());
        inbox.forget("prefill-0");
        inbox.accept("prefill-0", 1, vec![]).unwrap();
        assert!(inbox.accept("x", 1, vec![0; MAX_NOTIFICATION + 1]).is_err());
    }
}
