//! How a failed call is told to the peers and read from them: abort frames (kind, ranks,
//! message), goodbyes, the watch on links a step does not read, and the search for a peer's
//! reason behind unread data.

use crate::frame::P2P_CODE;
use monel_sched::plan::Algorithm;
use std::time::{Duration, Instant};

use crate::error::{CclError, ErrorKind, Result};
use crate::frame::{FRAME_ABORT, FRAME_CLOSE, HEADER_LEN, Header, Signature};
use crate::transport::Link;

use super::ctx::{Ctx, Name, lost};
use super::links::Links;

/// An abort frame's payload: read with a short bounded wait (abort frames are small and
/// sent whole).
pub(super) fn read_payload(link: &mut Box<dyn Link>, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len.min(4096)];
    let mut got = 0;
    let until = Instant::now() + Duration::from_millis(200);
    while got < buf.len() && Instant::now() < until {
        match link.read_some(&mut buf[got..]) {
            Ok(0) => std::thread::sleep(Duration::from_micros(100)),
            Ok(n) => got += n,
            Err(_) => break,
        }
    }
    buf.truncate(got);
    buf
}

pub(super) const ABORT_KINDS: [ErrorKind; 4] = [
    ErrorKind::RemoteAbort,
    ErrorKind::Timeout,
    ErrorKind::PeerLost,
    ErrorKind::Mismatch,
];

/// An abort frame's payload: the failure's kind, the ranks it names, its message. A rank
/// that learns of a failure from a peer reports the same kind and the same culprits.
pub(super) fn abort_payload(from: usize, e: &CclError) -> Vec<u8> {
    let kind = ABORT_KINDS.iter().position(|k| *k == e.kind).unwrap_or(0);
    let ranks = &e.ranks[..e.ranks.len().min(255)];
    let mut out = vec![kind as u8, ranks.len() as u8];
    for &r in ranks {
        out.extend((r as u32).to_le_bytes());
    }
    out.extend(format!("rank {from} gave up: {e}").as_bytes());
    out
}

pub(super) fn abort_error(peer: usize, what: &str, payload: &[u8]) -> CclError {
    let kind = payload
        .first()
        .and_then(|&k| ABORT_KINDS.get(usize::from(k)))
        .cloned()
        .unwrap_or(ErrorKind::RemoteAbort);
    let n = payload.get(1).map_or(0, |&n| usize::from(n));
    let ranks: Vec<usize> = payload
        .get(2..2 + 4 * n)
        .map(|b| {
            b.chunks_exact(4)
                .map(|c| u32::from_le_bytes(c.try_into().expect("4")) as usize)
                .collect()
        })
        .unwrap_or_default();
    let text = payload.get(2 + 4 * n..).unwrap_or_default();
    let ranks = if ranks.is_empty() { vec![peer] } else { ranks };
    CclError::new(kind, format!("{what}: {}", String::from_utf8_lossy(text))).with_ranks(ranks)
}

/// True if `peer`'s link holds, unread, an abort frame from collective `seq`: that rank
/// reached the collective and gave up (it may be gone by now).
pub(crate) fn gave_up_in(links: &Links, peer: usize, seq: u64) -> bool {
    let mut b = [0u8; HEADER_LEN];
    links
        .links
        .get(peer)
        .and_then(Option::as_ref)
        .is_some_and(|l| {
            matches!(l.peek(&mut b), Ok(HEADER_LEN))
                && Header::decode(&b).is_some_and(|h| h.kind == FRAME_ABORT && h.sig.seq == seq)
        })
}

/// The error for a frame from rank `p` whose signature `theirs` differs from this rank's
/// `mine`: another collective, type, count, root or operation, or the same call run with
/// another algorithm.
pub(super) fn sig_mismatch(
    name: Name<'_>,
    mine: &Signature,
    theirs: &Signature,
    p: usize,
) -> CclError {
    let message = if *theirs
        == (Signature {
            algo: theirs.algo,
            ..*mine
        }) {
        let algo = |c| Algorithm::from_code(c).map_or("no algorithm", Algorithm::name);
        format!(
            "mismatch: this rank runs {} with {} but rank {p} with {} (MONEL_ALGO or \
             set_algorithm differ between the ranks)",
            (name.describe)(mine),
            algo(mine.algo),
            algo(theirs.algo)
        )
    } else {
        format!(
            "mismatch: this rank called {} but rank {p} called {}",
            (name.describe)(mine),
            (name.describe)(theirs)
        )
    };
    CclError::new(ErrorKind::Mismatch, message).with_ranks(vec![p])
}

/// Looks at a link this step does not read from: a peer's abort, goodbye or death shows
/// here. Returns true if data for a later step waits there, or the link ended after the
/// peer's part in this call (`done_with`: what this step exchanges with it is done and no
/// later step sends to it or receives from it; a peer that finished its part and left is
/// no failure of this call, the next call sees it): do not poll it again.
pub(super) fn watch_idle(ctx: &mut Ctx<'_>, peer: usize, done_with: bool) -> Result<bool> {
    let name = ctx.name;
    let link = ctx.links.link(peer)?;
    let mut b = [0u8; HEADER_LEN];
    match link.peek(&mut b) {
        Ok(n) if n < HEADER_LEN => Ok(false),
        Ok(_) => match Header::decode(&b) {
            Some(h) if h.kind == FRAME_ABORT => {
                let mut full = vec![0u8; HEADER_LEN + (h.len as usize).min(4096)];
                let n = link.peek(&mut full).unwrap_or(0);
                Err(abort_error(peer, &name.what(), &full[HEADER_LEN.min(n)..n]))
            }
            Some(h) if h.kind == FRAME_CLOSE => {
                ctx.links.closed[peer] = true;
                Ok(true)
            }
            // Data of this very call (not of a later one the peer already began): it must
            // be the call this rank runs, and one a later step of it takes. A peer on
            // another schedule would otherwise leave it waiting here until the timeout.
            // Point-to-point messages number themselves per pair, so their numbers say
            // nothing about collectives: a peer that finished this call may already send.
            Some(h) if ctx.p2p.is_none() && h.sig.coll != P2P_CODE && h.sig.seq == name.sig.seq => {
                if h.sig != name.sig {
                    Err(sig_mismatch(name, &name.sig, &h.sig, peer))
                } else if done_with {
                    Err(CclError::new(
                        ErrorKind::Mismatch,
                        format!(
                            "{}: rank {peer} sent a message that this rank's schedule does \
                             not take (the ranks run different schedules)",
                            name.what()
                        ),
                    )
                    .with_ranks(vec![peer]))
                } else {
                    Ok(true)
                }
            }
            _ => Ok(true),
        },
        Err(_) if done_with => Ok(true),
        Err(e) => Err(lost(peer, &name.what(), &e)),
    }
}

/// A send to `peer` failed because its link is gone. A rank that fails sends its reason (an
/// abort frame) before it leaves, so if one waits unread on the link, behind data this rank
/// has not taken yet, that reason is the error: the lost link would blame the messenger for
/// the rank that failed first. `skip`: unread bytes of the frame being received, before the
/// next frame starts.
pub(super) fn reason_behind(ctx: &mut Ctx<'_>, peer: usize, skip: usize) -> Option<CclError> {
    if skip > SCAN_MAX {
        return None;
    }
    let what = ctx.name.what();
    let link = ctx.links.link(peer).ok()?;
    let mut buf = vec![0u8; skip + SCAN_MAX];
    let n = link.peek(&mut buf).ok()?;
    let body = abort_in(&buf[..n], skip)?;
    Some(abort_error(peer, &what, &buf[body]))
}

/// Unread bytes [`reason_behind`] looks through for an abort frame.
pub(super) const SCAN_MAX: usize = 64 << 10;

/// Where the payload of the first abort frame in `bytes` lies, frames starting at `at`;
/// `None` when the frames there hold none (or stop making sense).
pub(super) fn abort_in(bytes: &[u8], mut at: usize) -> Option<std::ops::Range<usize>> {
    while at + HEADER_LEN <= bytes.len() {
        let h = Header::decode(bytes[at..at + HEADER_LEN].try_into().ok()?)?;
        let body = at + HEADER_LEN;
        let end = body.checked_add(h.len as usize)?;
        if h.kind == FRAME_ABORT {
            return Some(body..end.min(bytes.len()));
        }
        at = end;
    }
    None
}

/// Tells every peer that rank `from` gave up, and why (an abort frame; see
/// [`write_all_bounded`] for links caught mid-frame).
pub(crate) fn send_abort(links: &mut Links, sig: Signature, from: usize, e: &CclError) {
    let payload = abort_payload(from, e);
    let h = Header {
        kind: FRAME_ABORT,
        sig,
        len: payload.len() as u32,
    }
    .encode();
    let mut frame = h.to_vec();
    frame.extend_from_slice(&payload);
    write_all_bounded(links, &frame);
}

/// Says goodbye to every peer.
pub(crate) fn send_close(links: &mut Links, sig: Signature) {
    let h = Header {
        kind: FRAME_CLOSE,
        sig,
        len: 0,
    }
    .encode();
    write_all_bounded(links, &h);
}

/// Writes a control frame to every link between frames. A link caught in the middle of a
/// data frame (the call failed while sending) is closed instead, so the peer sees the
/// connection end rather than a frame inside another.
pub(super) fn write_all_bounded(links: &mut Links, frame: &[u8]) {
    let until = Instant::now() + Duration::from_millis(500);
    for (slot, mid) in links.links.iter_mut().zip(&links.mid_frame) {
        if *mid {
            *slot = None;
        }
    }
    for l in links.links.iter_mut().flatten() {
        let mut at = 0;
        while at < frame.len() && Instant::now() < until {
            match l.write_some(&frame[at..]) {
                Ok(0) => std::thread::sleep(Duration::from_micros(200)),
                Ok(n) => at += n,
                Err(_) => break,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::FRAME_DATA;

    fn frame(kind: u8, payload: &[u8]) -> Vec<u8> {
        let sig = Signature {
            seq: 4,
            coll: 1,
            dtype: 7,
            op: 0,
            root: 0,
            count: 3,
            algo: 1,
        };
        let mut f = Header {
            kind,
            sig,
            len: payload.len() as u32,
        }
        .encode()
        .to_vec();
        f.extend_from_slice(payload);
        f
    }

    /// The reason a failed rank sent is found behind data this rank has not read, from the
    /// middle of a frame too, and turns back into the error it was.
    #[test]
    fn an_abort_waiting_behind_data_is_found_and_decoded() {
        let why = CclError::new(ErrorKind::PeerLost, "rank 0 left").with_ranks(vec![0]);
        let mut bytes = vec![7u8; 5]; // the rest of a frame being received
        bytes.extend(frame(FRAME_DATA, &[1; 12]));
        bytes.extend(frame(FRAME_CLOSE, &[]));
        bytes.extend(frame(FRAME_ABORT, &abort_payload(1, &why)));
        let body = abort_in(&bytes, 5).expect("found");
        let e = abort_error(1, "all_reduce #4", &bytes[body]);
        assert_eq!(e.kind, ErrorKind::PeerLost);
        assert_eq!(e.ranks, vec![0]);
        assert!(e.message.contains("rank 0 left"), "{e}");
        // Without the abort, or out of step with the frames, or cut short: nothing, or what
        // arrived of it.
        let data_only = frame(FRAME_DATA, &[1; 12]);
        assert_eq!(abort_in(&data_only, 0), None);
        assert_eq!(
            abort_in(&bytes, 3),
            None,
            "garbage where a header should be"
        );
        let cut = &bytes[..bytes.len() - 2];
        let body = abort_in(cut, 5).expect("found");
        assert_eq!(body.end, cut.len());
        assert_eq!(abort_in(&bytes[..20], 0), None);
    }
}
