//! The RoCEv2 congestion notification packet (opcode 0x81, IBA annex A17).
//!
//! BTH with BECN set, P_Key 0xffff, DestQP = the QP to slow down, PSN 0, then 16 reserved zero
//! bytes and the ICRC: 32 bytes of UDP payload.

use crate::{BthRepr, ExtHeaders, Opcode, PKey, Psn, Qpn, RoceRepr};

/// Length of a CNP's UDP payload.
pub const CNP_LEN: usize = 12 + 16 + 4;

/// The CNP that tells the sender of `dest_qp` to slow down.
pub const fn cnp_repr(dest_qp: Qpn) -> RoceRepr {
    RoceRepr {
        bth: BthRepr {
            opcode: Opcode::CNP,
            solicited: false,
            migreq: false,
            pad_count: 0,
            pkey: PKey::DEFAULT,
            fecn: false,
            becn: true,
            dest_qp,
            ack_req: false,
            psn: Psn::new(0),
        },
        ext: ExtHeaders::Cnp,
        payload_len: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RocePacket;

    #[test]
    fn matches_connectx_capture() {
        // Vector A's BTH and reserved bytes (ICRC zeroed here; framing fills it).
        let mut buf = [0u8; CNP_LEN];
        assert_eq!(cnp_repr(Qpn::new(0x118)).emit(&mut buf), Ok(CNP_LEN));
        assert_eq!(
            &buf[..12],
            &[0x81, 0, 0xff, 0xff, 0x40, 0, 0x01, 0x18, 0, 0, 0, 0]
        );
        let p = RocePacket::new_checked(&buf[..]).unwrap();
        assert!(p.bth().becn());
        assert_eq!(p.payload().len(), 0);
    }
}
