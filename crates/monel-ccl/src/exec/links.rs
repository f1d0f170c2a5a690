//! One rank's links to its peers, with what the executor tracks of each: a goodbye seen, a
//! data frame partly written; and the small exchange outside a schedule (the tiny path).

use crate::error::{CclError, Result};
use crate::frame::{FRAME_DATA, HEADER_LEN, Header, Signature};
use crate::transport::Link;

/// One rank's links, indexed by peer rank (None for itself).
pub(crate) struct Links {
    pub(super) links: Vec<Option<Box<dyn Link>>>,
    /// Peers that said goodbye (destroyed their communicator).
    pub(super) closed: Vec<bool>,
    /// Links with a data frame partly written.
    pub(super) mid_frame: Vec<bool>,
}

impl Links {
    /// The executor's state over fresh links (`None` for this rank).
    pub(crate) fn new(links: Vec<Option<Box<dyn Link>>>) -> Self {
        let n = links.len();
        Self {
            links,
            closed: vec![false; n],
            mid_frame: vec![false; n],
        }
    }

    /// The link to `peer`, if there is one.
    pub(crate) fn get(&self, peer: usize) -> Option<&dyn Link> {
        self.links.get(peer)?.as_deref()
    }

    /// Drops every link (after an abort: the peers see the connections close).
    pub(crate) fn close_all(&mut self) {
        self.links.iter_mut().for_each(|l| *l = None);
    }

    /// Every peer's link, by rank.
    pub(crate) fn all(&self) -> impl Iterator<Item = Option<&dyn Link>> {
        self.links.iter().map(|l| l.as_deref())
    }

    /// One data frame each way with `peer`, outside a schedule, for calls too small for
    /// the executor's machinery: sends `payload` under `sig` whole, then looks for the
    /// peer's frame of the same signature and length for up to `spins` rounds, handing its
    /// payload to `land` where it lies (a ring). `None`: nothing was sent (no ring link, a
    /// frame already in progress, or no room); `Some(false)`: sent, but the peer's frame is
    /// not there (the executor receives it, with whatever else arrives first).
    pub(crate) fn exchange_whole(
        &mut self,
        peer: usize,
        sig: Signature,
        payload: &[u8],
        spins: u32,
        yield_often: bool,
        land: &mut dyn FnMut(&[u8]),
    ) -> Option<bool> {
        if *self.closed.get(peer)? || self.mid_frame[peer] {
            return None;
        }
        let link = self.links[peer].as_mut()?;
        let hdr = Header {
            kind: FRAME_DATA,
            sig,
            len: u32::try_from(payload.len()).ok()?,
        };
        if !link.write_whole(&hdr.encode(), payload).unwrap_or(false) {
            return None;
        }
        let want = HEADER_LEN + payload.len();
        let mut landed = false;
        for round in 0..spins {
            let r = link.read_in_place(want, &mut |b| {
                if b.len() < want
                    || Header::decode(b[..HEADER_LEN].try_into().expect("header")) != Some(hdr)
                {
                    return 0;
                }
                land(&b[HEADER_LEN..]);
                landed = true;
                want
            });
            match r {
                Some(Ok(_)) if landed => break,
                None | Some(Err(_)) => break,
                _ if yield_often || round % 64 == 63 => std::thread::yield_now(),
                _ => std::hint::spin_loop(),
            }
        }
        Some(landed)
    }

    pub(super) fn link(&mut self, peer: usize) -> Result<&mut Box<dyn Link>> {
        self.links
            .get_mut(peer)
            .and_then(Option::as_mut)
            .ok_or_else(|| CclError::internal(format!("no link to rank {peer}")))
    }
}
