//! QP states, attributes, the attribute mask, and the state machine of `ibv_modify_qp` for RC.

use core::fmt;
use core::ops::{BitAnd, BitOr, BitOrAssign, Not};

use monel_wire::{PKey, Psn, QKey, Qpn};

use crate::memory::AccessFlags;

/// QP state (`ibv_qp_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum QpState {
    /// Just created or reset: nothing is processed.
    #[default]
    Reset,
    /// Initialised: receives may be posted.
    Init,
    /// Ready to receive.
    Rtr,
    /// Ready to send.
    Rts,
    /// Send queue drain: no new send WQEs start.
    Sqd,
    /// Send queue error (UC/UD only).
    Sqe,
    /// Error: everything outstanding is flushed.
    Err,
}

/// Path MTU (`ibv_mtu`): the payload size of every packet but the last of a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub enum Mtu {
    /// 256 bytes.
    #[default]
    Mtu256 = 1,
    /// 512 bytes.
    Mtu512 = 2,
    /// 1024 bytes.
    Mtu1024 = 3,
    /// 2048 bytes.
    Mtu2048 = 4,
    /// 4096 bytes.
    Mtu4096 = 5,
}

impl Mtu {
    /// Payload bytes per packet.
    pub const fn bytes(self) -> u32 {
        1 << (self as u32 + 7)
    }
    /// The MTU of a byte count, if it is one of the five.
    pub const fn from_bytes(b: u32) -> Option<Self> {
        Some(match b {
            256 => Self::Mtu256,
            512 => Self::Mtu512,
            1024 => Self::Mtu1024,
            2048 => Self::Mtu2048,
            4096 => Self::Mtu4096,
            _ => return None,
        })
    }
}

/// `ibv_qp_attr_mask`: which attributes a modify call carries (same bit values as verbs).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AttrMask(pub u32);

#[allow(missing_docs)]
impl AttrMask {
    pub const STATE: Self = Self(1 << 0);
    pub const CUR_STATE: Self = Self(1 << 1);
    pub const EN_SQD_ASYNC_NOTIFY: Self = Self(1 << 2);
    pub const ACCESS_FLAGS: Self = Self(1 << 3);
    pub const PKEY_INDEX: Self = Self(1 << 4);
    pub const PORT: Self = Self(1 << 5);
    pub const QKEY: Self = Self(1 << 6);
    pub const AV: Self = Self(1 << 7);
    pub const PATH_MTU: Self = Self(1 << 8);
    pub const TIMEOUT: Self = Self(1 << 9);
    pub const RETRY_CNT: Self = Self(1 << 10);
    pub const RNR_RETRY: Self = Self(1 << 11);
    pub const RQ_PSN: Self = Self(1 << 12);
    pub const MAX_QP_RD_ATOMIC: Self = Self(1 << 13);
    pub const ALT_PATH: Self = Self(1 << 14);
    pub const MIN_RNR_TIMER: Self = Self(1 << 15);
    pub const SQ_PSN: Self = Self(1 << 16);
    pub const MAX_DEST_RD_ATOMIC: Self = Self(1 << 17);
    pub const PATH_MIG_STATE: Self = Self(1 << 18);
    pub const CAP: Self = Self(1 << 19);
    pub const DEST_QPN: Self = Self(1 << 20);
    pub const NONE: Self = Self(0);

    const NAMES: [&'static str; 21] = [
        "STATE",
        "CUR_STATE",
        "EN_SQD_ASYNC_NOTIFY",
        "ACCESS_FLAGS",
        "PKEY_INDEX",
        "PORT",
        "QKEY",
        "AV",
        "PATH_MTU",
        "TIMEOUT",
        "RETRY_CNT",
        "RNR_RETRY",
        "RQ_PSN",
        "MAX_QP_RD_ATOMIC",
        "ALT_PATH",
        "MIN_RNR_TIMER",
        "SQ_PSN",
        "MAX_DEST_RD_ATOMIC",
        "PATH_MIG_STATE",
        "CAP",
        "DEST_QPN",
    ];

    /// True if every bit of `other` is set here.
    pub const fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }
    /// True if no bit is set.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }
}
impl BitOr for AttrMask {
    type Output = Self;
    fn bitor(self, o: Self) -> Self {
        Self(self.0 | o.0)
    }
}
impl BitOrAssign for AttrMask {
    fn bitor_assign(&mut self, o: Self) {
        self.0 |= o.0;
    }
}
impl BitAnd for AttrMask {
    type Output = Self;
    fn bitand(self, o: Self) -> Self {
        Self(self.0 & o.0)
    }
}
impl Not for AttrMask {
    type Output = Self;
    fn not(self) -> Self {
        Self(!self.0)
    }
}
impl fmt::Debug for AttrMask {
    /// Lists the names, e.g. `AV | PATH_MTU`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for (i, name) in Self::NAMES.iter().enumerate() {
            if self.0 & (1 << i) != 0 {
                if !first {
                    f.write_str(" | ")?;
                }
                f.write_str(name)?;
                first = false;
            }
        }
        if first {
            f.write_str("(none)")?;
        }
        Ok(())
    }
}
impl fmt::Display for AttrMask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// The address vector of a connected QP: where its packets go. The engine keeps it for the
/// framing layer and never interprets it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AddressVector {
    /// Destination GID (IPv4-mapped for IPv4 peers).
    pub dgid: [u8; 16],
    /// Index of the source GID in the local GID table.
    pub sgid_index: u8,
    /// IP TTL / hop limit.
    pub hop_limit: u8,
    /// IP traffic class (DSCP << 2 | ECN).
    pub traffic_class: u8,
    /// IPv6 flow label (also seeds the UDP source port).
    pub flow_label: u32,
    /// Service level.
    pub sl: u8,
}

/// QP attributes (`ibv_qp_attr`, the fields RC uses). Which ones a modify call applies is
/// given by an [`AttrMask`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QpAttr {
    /// Target state.
    pub qp_state: QpState,
    /// Current state, if the caller asserts it.
    pub cur_qp_state: QpState,
    /// Path MTU.
    pub path_mtu: Mtu,
    /// Remote QP number.
    pub dest_qp_num: Qpn,
    /// Expected PSN of the first incoming request.
    pub rq_psn: Psn,
    /// PSN of the first outgoing request.
    pub sq_psn: Psn,
    /// Remote access the QP allows (REMOTE_WRITE, REMOTE_READ, REMOTE_ATOMIC).
    pub qp_access_flags: AccessFlags,
    /// P_Key table index.
    pub pkey_index: u16,
    /// Port number.
    pub port_num: u8,
    /// Address vector of the peer.
    pub ah_attr: AddressVector,
    /// Local ACK timeout exponent: 4.096 us x 2^timeout, 0 = infinite.
    pub timeout: u8,
    /// Retries after a timeout or sequence NAK (0..=7).
    pub retry_cnt: u8,
    /// Retries after an RNR NAK (0..=7; 7 = infinite).
    pub rnr_retry: u8,
    /// RNR timer code this QP's responder puts in its RNR NAKs.
    pub min_rnr_timer: u8,
    /// Outstanding READ/atomic requests this QP may have as requester.
    pub max_rd_atomic: u8,
    /// Outstanding READ/atomic requests this QP accepts as responder.
    pub max_dest_rd_atomic: u8,
    /// Q_Key (UD QPs): incoming datagrams must carry it.
    pub qkey: QKey,
}

/// Why a modify call was refused.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModifyError {
    /// The transition is not in the RC state table.
    InvalidTransition {
        /// State the QP is in.
        from: QpState,
        /// State asked for.
        to: QpState,
    },
    /// Attributes the transition requires are missing from the mask.
    MissingAttrs {
        /// State the QP is in.
        from: QpState,
        /// State asked for.
        to: QpState,
        /// The missing attributes.
        missing: AttrMask,
    },
    /// Attributes the transition does not allow are in the mask.
    UnexpectedAttrs {
        /// State the QP is in.
        from: QpState,
        /// State asked for.
        to: QpState,
        /// The attributes not allowed.
        extra: AttrMask,
    },
    /// `cur_qp_state` does not match the real state.
    CurrentStateMismatch {
        /// The real state.
        actual: QpState,
        /// What the caller said.
        claimed: QpState,
    },
    /// An attribute value out of range.
    InvalidValue {
        /// Name of the attribute.
        attr: &'static str,
        /// The value given.
        value: u32,
    },
}

impl fmt::Display for ModifyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InvalidTransition { from, to } => {
                write!(f, "modify_qp: no transition {from:?} -> {to:?} for RC")
            }
            Self::MissingAttrs { from, to, missing } => {
                write!(
                    f,
                    "modify_qp {from:?} -> {to:?}: missing attributes {missing}"
                )
            }
            Self::UnexpectedAttrs { from, to, extra } => {
                write!(
                    f,
                    "modify_qp {from:?} -> {to:?}: attributes not allowed here: {extra}"
                )
            }
            Self::CurrentStateMismatch { actual, claimed } => {
                write!(
                    f,
                    "modify_qp: cur_qp_state {claimed:?} but QP is {actual:?}"
                )
            }
            Self::InvalidValue { attr, value } => {
                write!(f, "modify_qp: invalid value {value} for {attr}")
            }
        }
    }
}
impl std::error::Error for ModifyError {}

/// Required and optional attributes of an RC transition (IBA table 91, as `ib_modify_qp_is_ok`).
pub(crate) fn transition_masks(from: QpState, to: QpState) -> Option<(AttrMask, AttrMask)> {
    use QpState::*;
    type M = AttrMask;
    let none = M::NONE;
    Some(match (from, to) {
        (_, Reset) | (_, Err) => (none, none),
        (Reset, Init) => (M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS, none),
        (Init, Init) => (none, M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS),
        (Init, Rtr) => (
            M::AV
                | M::PATH_MTU
                | M::DEST_QPN
                | M::RQ_PSN
                | M::MAX_DEST_RD_ATOMIC
                | M::MIN_RNR_TIMER,
            M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX,
        ),
        (Rtr, Rts) => (
            M::SQ_PSN | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC,
            M::CUR_STATE | M::ALT_PATH | M::ACCESS_FLAGS | M::MIN_RNR_TIMER | M::PATH_MIG_STATE,
        ),
        (Rts, Rts) | (Sqd, Rts) | (Sqe, Rts) => (
            none,
            M::CUR_STATE | M::ACCESS_FLAGS | M::ALT_PATH | M::PATH_MIG_STATE | M::MIN_RNR_TIMER,
        ),
        (Rts, Sqd) => (none, M::EN_SQD_ASYNC_NOTIFY),
        (Sqd, Sqd) => (
            none,
            M::AV
                | M::TIMEOUT
                | M::RETRY_CNT
                | M::RNR_RETRY
                | M::MAX_QP_RD_ATOMIC
                | M::MAX_DEST_RD_ATOMIC
                | M::ALT_PATH
                | M::ACCESS_FLAGS
                | M::PKEY_INDEX
                | M::MIN_RNR_TIMER
                | M::PATH_MIG_STATE,
        ),
        _ => return None,
    })
}

/// Checks a modify call against the state table and the value ranges.
pub(crate) fn check_modify(
    cur: QpState,
    attr: &QpAttr,
    mask: AttrMask,
    max_rd_atomic: u8,
) -> Result<QpState, ModifyError> {
    let to = check_transition(cur, attr, mask, transition_masks)?;
    let bad = |attr: &'static str, value: u32| Err(ModifyError::InvalidValue { attr, value });
    if mask.contains(AttrMask::TIMEOUT) && attr.timeout > 31 {
        return bad("timeout", attr.timeout.into());
    }
    if mask.contains(AttrMask::RETRY_CNT) && attr.retry_cnt > 7 {
        return bad("retry_cnt", attr.retry_cnt.into());
    }
    if mask.contains(AttrMask::RNR_RETRY) && attr.rnr_retry > 7 {
        return bad("rnr_retry", attr.rnr_retry.into());
    }
    if mask.contains(AttrMask::MIN_RNR_TIMER) && attr.min_rnr_timer > 31 {
        return bad("min_rnr_timer", attr.min_rnr_timer.into());
    }
    if mask.contains(AttrMask::DEST_QPN) && attr.dest_qp_num.value() == 0 {
        return bad("dest_qp_num", 0);
    }
    if mask.contains(AttrMask::MAX_QP_RD_ATOMIC) && attr.max_rd_atomic > max_rd_atomic {
        return bad("max_rd_atomic", attr.max_rd_atomic.into());
    }
    if mask.contains(AttrMask::MAX_DEST_RD_ATOMIC) && attr.max_dest_rd_atomic > max_rd_atomic {
        return bad("max_dest_rd_atomic", attr.max_dest_rd_atomic.into());
    }
    Ok(to)
}

/// Checks `cur_qp_state`, the transition's required and allowed attributes against a
/// transport's state `table`, and the port number; returns the target state.
pub(crate) fn check_transition(
    cur: QpState,
    attr: &QpAttr,
    mask: AttrMask,
    table: fn(QpState, QpState) -> Option<(AttrMask, AttrMask)>,
) -> Result<QpState, ModifyError> {
    let to = if mask.contains(AttrMask::STATE) {
        attr.qp_state
    } else {
        cur
    };
    if mask.contains(AttrMask::CUR_STATE) && attr.cur_qp_state != cur {
        return Err(ModifyError::CurrentStateMismatch {
            actual: cur,
            claimed: attr.cur_qp_state,
        });
    }
    let (required, optional) =
        table(cur, to).ok_or(ModifyError::InvalidTransition { from: cur, to })?;
    let given = mask & !AttrMask::STATE;
    let missing = required & !given;
    if !missing.is_empty() {
        return Err(ModifyError::MissingAttrs {
            from: cur,
            to,
            missing,
        });
    }
    let extra = given & !(required | optional);
    if !extra.is_empty() {
        return Err(ModifyError::UnexpectedAttrs {
            from: cur,
            to,
            extra,
        });
    }
    if mask.contains(AttrMask::PORT) && attr.port_num != 1 {
        return Err(ModifyError::InvalidValue {
            attr: "port_num",
            value: attr.port_num.into(),
        });
    }
    Ok(to)
}

/// The P_Key every Monel RC packet carries (index 0 of the default table).
pub(crate) const DEFAULT_PKEY: PKey = PKey::DEFAULT;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mask_names() {
        let m = AttrMask::AV | AttrMask::PATH_MTU;
        assert_eq!(format!("{m}"), "AV | PATH_MTU");
        assert_eq!(format!("{}", AttrMask::NONE), "(none)");
    }

    #[test]
    fn init_to_rtr_needs_its_attributes() {
        let attr = QpAttr {
            qp_state: QpState::Rtr,
            ..Default::default()
        };
        let err = check_modify(QpState::Init, &attr, AttrMask::STATE | AttrMask::AV, 16);
        assert_eq!(
            err,
            Err(ModifyError::MissingAttrs {
                from: QpState::Init,
                to: QpState::Rtr,
                missing: AttrMask::PATH_MTU
                    | AttrMask::DEST_QPN
                    | AttrMask::RQ_PSN
                    | AttrMask::MAX_DEST_RD_ATOMIC
                    | AttrMask::MIN_RNR_TIMER,
            })
        );
        let e = err.unwrap_err().to_string();
        assert!(e.contains("missing attributes PATH_MTU | RQ_PSN"), "{e}");
    }

    #[test]
    fn illegal_transitions() {
        let attr = QpAttr {
            qp_state: QpState::Rts,
            ..Default::default()
        };
        assert_eq!(
            check_modify(QpState::Reset, &attr, AttrMask::STATE, 16),
            Err(ModifyError::InvalidTransition {
                from: QpState::Reset,
                to: QpState::Rts
            })
        );
        let to_err = QpAttr {
            qp_state: QpState::Err,
            ..Default::default()
        };
        for s in [
            QpState::Reset,
            QpState::Init,
            QpState::Rtr,
            QpState::Rts,
            QpState::Sqd,
        ] {
            assert_eq!(
                check_modify(s, &to_err, AttrMask::STATE, 16),
                Ok(QpState::Err)
            );
        }
        let extra = QpAttr {
            qp_state: QpState::Init,
            ..Default::default()
        };
        assert!(matches!(
            check_modify(
                QpState::Reset,
                &extra,
                AttrMask::STATE
                    | AttrMask::PKEY_INDEX
                    | AttrMask::PORT
                    | AttrMask::ACCESS_FLAGS
                    | AttrMask::SQ_PSN,
                16
            ),
            Err(ModifyError::UnexpectedAttrs { .. })
        ));
    }
}
