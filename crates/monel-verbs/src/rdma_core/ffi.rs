//! The C ABI of rdma-core's `<infiniband/verbs.h>` that Monel uses, written out by hand so
//! nothing of rdma-core is needed to build (NCCL's ibvwrap does the same). Structs Monel
//! only points at are declared up to the last field it reads; structs it fills are complete.
//! The layouts are checked against the real header by a test that compiles it with the C
//! compiler (`abi_matches_verbs_h`).
#![allow(non_camel_case_types, missing_docs, unreachable_pub, dead_code)]

use std::ffi::{c_char, c_int, c_uint, c_void};

/// `struct ibv_device`: only ever pointed at.
#[repr(C)]
pub struct ibv_device {
    _private: [u8; 0],
}

/// `struct ibv_context_ops`: the data-path entry points a provider fills (the rest are
/// compatibility slots, kept for their places).
#[repr(C)]
pub struct ibv_context_ops {
    _compat_before_poll_cq: [*mut c_void; 11],
    pub poll_cq: Option<unsafe extern "C" fn(*mut ibv_cq, c_int, *mut ibv_wc) -> c_int>,
    pub req_notify_cq: Option<unsafe extern "C" fn(*mut ibv_cq, c_int) -> c_int>,
    _compat_before_post_srq_recv: [*mut c_void; 7],
    pub post_srq_recv: Option<
        unsafe extern "C" fn(*mut ibv_srq, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int,
    >,
    _compat_before_post_send: [*mut c_void; 4],
    pub post_send:
        Option<unsafe extern "C" fn(*mut ibv_qp, *mut ibv_send_wr, *mut *mut ibv_send_wr) -> c_int>,
    pub post_recv:
        Option<unsafe extern "C" fn(*mut ibv_qp, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int>,
    _compat_after_post_recv: [*mut c_void; 5],
}

/// `struct ibv_context`, up to `async_fd`.
#[repr(C)]
pub struct ibv_context {
    pub device: *mut ibv_device,
    pub ops: ibv_context_ops,
    pub cmd_fd: c_int,
    pub async_fd: c_int,
}

/// `union ibv_gid` (aligned as its `global` view of two 64-bit words).
#[repr(C, align(8))]
#[derive(Clone, Copy, Default)]
pub struct ibv_gid {
    pub raw: [u8; 16],
}

/// `struct ibv_port_attr` (complete: `ibv_query_port` fills it).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_port_attr {
    pub state: c_uint,
    pub max_mtu: c_uint,
    pub active_mtu: c_uint,
    pub gid_tbl_len: c_int,
    pub port_cap_flags: u32,
    pub max_msg_sz: u32,
    pub bad_pkey_cntr: u32,
    pub qkey_viol_cntr: u32,
    pub pkey_tbl_len: u16,
    pub lid: u16,
    pub sm_lid: u16,
    pub lmc: u8,
    pub max_vl_num: u8,
    pub sm_sl: u8,
    pub subnet_timeout: u8,
    pub init_type_reply: u8,
    pub active_width: u8,
    pub active_speed: u8,
    pub phys_state: u8,
    pub link_layer: u8,
    pub flags: u8,
    pub port_cap_flags2: u16,
}

/// `struct ibv_pd`.
#[repr(C)]
pub struct ibv_pd {
    pub context: *mut ibv_context,
    pub handle: u32,
}

/// `struct ibv_mr`.
#[repr(C)]
pub struct ibv_mr {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub addr: *mut c_void,
    pub length: usize,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

/// `struct ibv_comp_channel`.
#[repr(C)]
pub struct ibv_comp_channel {
    pub context: *mut ibv_context,
    pub fd: c_int,
    pub refcnt: c_int,
}

/// `struct ibv_cq`, up to `cqe`.
#[repr(C)]
pub struct ibv_cq {
    pub context: *mut ibv_context,
    pub channel: *mut ibv_comp_channel,
    pub cq_context: *mut c_void,
    pub handle: u32,
    pub cqe: c_int,
}

/// `struct ibv_srq`, up to `handle`.
#[repr(C)]
pub struct ibv_srq {
    pub context: *mut ibv_context,
    pub srq_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub handle: u32,
}

/// `struct ibv_qp`, up to `qp_type`.
#[repr(C)]
pub struct ibv_qp {
    pub context: *mut ibv_context,
    pub qp_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub handle: u32,
    pub qp_num: u32,
    pub state: c_uint,
    pub qp_type: c_uint,
}

/// `struct ibv_ah`.
#[repr(C)]
pub struct ibv_ah {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub handle: u32,
}

/// `struct ibv_qp_cap`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_qp_cap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

/// `struct ibv_qp_init_attr`.
#[repr(C)]
pub struct ibv_qp_init_attr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub cap: ibv_qp_cap,
    pub qp_type: c_uint,
    pub sq_sig_all: c_int,
}

/// `struct ibv_global_route`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_global_route {
    pub dgid: ibv_gid,
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
}

/// `struct ibv_ah_attr`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_ah_attr {
    pub grh: ibv_global_route,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
}

/// `struct ibv_qp_attr`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_qp_attr {
    pub qp_state: c_uint,
    pub cur_qp_state: c_uint,
    pub path_mtu: c_uint,
    pub path_mig_state: c_uint,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: c_uint,
    pub cap: ibv_qp_cap,
    pub ah_attr: ibv_ah_attr,
    pub alt_ah_attr: ibv_ah_attr,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub rate_limit: u32,
}

/// `struct ibv_sge`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// `wr.rdma` of `struct ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct wr_rdma {
    pub remote_addr: u64,
    pub rkey: u32,
}

/// `wr.atomic` of `struct ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct wr_atomic {
    pub remote_addr: u64,
    pub compare_add: u64,
    pub swap: u64,
    pub rkey: u32,
}

/// `wr.ud` of `struct ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct wr_ud {
    pub ah: *mut ibv_ah,
    pub remote_qpn: u32,
    pub remote_qkey: u32,
}

/// The `wr` union of `struct ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union wr_union {
    pub rdma: wr_rdma,
    pub atomic: wr_atomic,
    pub ud: wr_ud,
}

/// `struct ibv_send_wr` (complete; the memory-window and TSO union Monel leaves zero).
#[repr(C)]
pub struct ibv_send_wr {
    pub wr_id: u64,
    pub next: *mut Self,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
    pub opcode: c_uint,
    pub send_flags: c_uint,
    /// Immediate data in network byte order, or the R_Key to invalidate.
    pub imm_data: u32,
    pub wr: wr_union,
    pub xrc_remote_srqn: u32,
    _bind_mw_or_tso: [u64; 6],
}

impl ibv_send_wr {
    /// A zeroed request (every pointer null).
    pub fn zeroed() -> Self {
        Self {
            wr_id: 0,
            next: std::ptr::null_mut(),
            sg_list: std::ptr::null_mut(),
            num_sge: 0,
            opcode: 0,
            send_flags: 0,
            imm_data: 0,
            wr: wr_union {
                atomic: wr_atomic {
                    remote_addr: 0,
                    compare_add: 0,
                    swap: 0,
                    rkey: 0,
                },
            },
            xrc_remote_srqn: 0,
            _bind_mw_or_tso: [0; 6],
        }
    }
}

/// `struct ibv_recv_wr`.
#[repr(C)]
pub struct ibv_recv_wr {
    pub wr_id: u64,
    pub next: *mut Self,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
}

/// `struct ibv_wc`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_wc {
    pub wr_id: u64,
    pub status: c_uint,
    pub opcode: c_uint,
    pub vendor_err: u32,
    pub byte_len: u32,
    /// Immediate data in network byte order, or the invalidated R_Key.
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: c_uint,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

/// `struct ibv_srq_attr`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_srq_attr {
    pub max_wr: u32,
    pub max_sge: u32,
    pub srq_limit: u32,
}

/// `struct ibv_srq_init_attr`.
#[repr(C)]
pub struct ibv_srq_init_attr {
    pub srq_context: *mut c_void,
    pub attr: ibv_srq_attr,
}

/// `struct ibv_async_event`: `element` is a CQ, QP, SRQ or WQ pointer, or a port number.
#[repr(C)]
pub struct ibv_async_event {
    pub element: *mut c_void,
    pub event_type: c_uint,
}

// enum ibv_wr_opcode
pub const IBV_WR_RDMA_WRITE: c_uint = 0;
pub const IBV_WR_RDMA_WRITE_WITH_IMM: c_uint = 1;
pub const IBV_WR_SEND: c_uint = 2;
pub const IBV_WR_SEND_WITH_IMM: c_uint = 3;
pub const IBV_WR_RDMA_READ: c_uint = 4;
pub const IBV_WR_ATOMIC_CMP_AND_SWP: c_uint = 5;
pub const IBV_WR_ATOMIC_FETCH_AND_ADD: c_uint = 6;
pub const IBV_WR_SEND_WITH_INV: c_uint = 9;
// enum ibv_send_flags
pub const IBV_SEND_FENCE: c_uint = 1;
pub const IBV_SEND_SIGNALED: c_uint = 2;
pub const IBV_SEND_SOLICITED: c_uint = 4;
pub const IBV_SEND_INLINE: c_uint = 8;
// enum ibv_wc_opcode
pub const IBV_WC_SEND: c_uint = 0;
pub const IBV_WC_RDMA_WRITE: c_uint = 1;
pub const IBV_WC_RDMA_READ: c_uint = 2;
pub const IBV_WC_COMP_SWAP: c_uint = 3;
pub const IBV_WC_FETCH_ADD: c_uint = 4;
pub const IBV_WC_RECV: c_uint = 128;
pub const IBV_WC_RECV_RDMA_WITH_IMM: c_uint = 129;
// enum ibv_wc_flags
pub const IBV_WC_GRH: c_uint = 1;
pub const IBV_WC_WITH_IMM: c_uint = 2;
pub const IBV_WC_WITH_INV: c_uint = 8;
// enum ibv_qp_type
pub const IBV_QPT_RC: c_uint = 2;
pub const IBV_QPT_UD: c_uint = 4;
// enum ibv_srq_attr_mask
pub const IBV_SRQ_LIMIT: c_int = 2;
// enum ibv_port_state
pub const IBV_PORT_ACTIVE: c_uint = 4;
// enum ibv_event_type
pub const IBV_EVENT_CQ_ERR: c_uint = 0;
pub const IBV_EVENT_QP_FATAL: c_uint = 1;
pub const IBV_EVENT_QP_REQ_ERR: c_uint = 2;
pub const IBV_EVENT_QP_ACCESS_ERR: c_uint = 3;
pub const IBV_EVENT_COMM_EST: c_uint = 4;
pub const IBV_EVENT_SQ_DRAINED: c_uint = 5;
pub const IBV_EVENT_DEVICE_FATAL: c_uint = 8;
pub const IBV_EVENT_PORT_ACTIVE: c_uint = 9;
pub const IBV_EVENT_PORT_ERR: c_uint = 10;
pub const IBV_EVENT_SRQ_ERR: c_uint = 14;
pub const IBV_EVENT_SRQ_LIMIT_REACHED: c_uint = 15;
pub const IBV_EVENT_QP_LAST_WQE_REACHED: c_uint = 16;
pub const IBV_EVENT_GID_CHANGE: c_uint = 18;

// The exported functions Monel resolves (`IBVERBS_1.1` unless noted).
pub type GetDeviceList = unsafe extern "C" fn(*mut c_int) -> *mut *mut ibv_device;
pub type FreeDeviceList = unsafe extern "C" fn(*mut *mut ibv_device);
pub type GetDeviceName = unsafe extern "C" fn(*mut ibv_device) -> *const c_char;
pub type OpenDevice = unsafe extern "C" fn(*mut ibv_device) -> *mut ibv_context;
pub type CloseDevice = unsafe extern "C" fn(*mut ibv_context) -> c_int;
pub type QueryPort = unsafe extern "C" fn(*mut ibv_context, u8, *mut ibv_port_attr) -> c_int;
pub type QueryGid = unsafe extern "C" fn(*mut ibv_context, u8, c_int, *mut ibv_gid) -> c_int;
pub type AllocPd = unsafe extern "C" fn(*mut ibv_context) -> *mut ibv_pd;
pub type DeallocPd = unsafe extern "C" fn(*mut ibv_pd) -> c_int;
pub type RegMr = unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, c_int) -> *mut ibv_mr;
pub type DeregMr = unsafe extern "C" fn(*mut ibv_mr) -> c_int;
pub type CreateCompChannel = unsafe extern "C" fn(*mut ibv_context) -> *mut ibv_comp_channel;
pub type DestroyCompChannel = unsafe extern "C" fn(*mut ibv_comp_channel) -> c_int;
pub type CreateCq = unsafe extern "C" fn(
    *mut ibv_context,
    c_int,
    *mut c_void,
    *mut ibv_comp_channel,
    c_int,
) -> *mut ibv_cq;
pub type DestroyCq = unsafe extern "C" fn(*mut ibv_cq) -> c_int;
pub type GetCqEvent =
    unsafe extern "C" fn(*mut ibv_comp_channel, *mut *mut ibv_cq, *mut *mut c_void) -> c_int;
pub type AckCqEvents = unsafe extern "C" fn(*mut ibv_cq, c_uint);
pub type CreateQp = unsafe extern "C" fn(*mut ibv_pd, *mut ibv_qp_init_attr) -> *mut ibv_qp;
pub type ModifyQp = unsafe extern "C" fn(*mut ibv_qp, *mut ibv_qp_attr, c_int) -> c_int;
pub type QueryQp =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_qp_attr, c_int, *mut ibv_qp_init_attr) -> c_int;
pub type DestroyQp = unsafe extern "C" fn(*mut ibv_qp) -> c_int;
pub type CreateSrq = unsafe extern "C" fn(*mut ibv_pd, *mut ibv_srq_init_attr) -> *mut ibv_srq;
pub type ModifySrq = unsafe extern "C" fn(*mut ibv_srq, *mut ibv_srq_attr, c_int) -> c_int;
pub type QuerySrq = unsafe extern "C" fn(*mut ibv_srq, *mut ibv_srq_attr) -> c_int;
pub type DestroySrq = unsafe extern "C" fn(*mut ibv_srq) -> c_int;
pub type CreateAh = unsafe extern "C" fn(*mut ibv_pd, *mut ibv_ah_attr) -> *mut ibv_ah;
pub type DestroyAh = unsafe extern "C" fn(*mut ibv_ah) -> c_int;
pub type GetAsyncEvent = unsafe extern "C" fn(*mut ibv_context, *mut ibv_async_event) -> c_int;
pub type AckAsyncEvent = unsafe extern "C" fn(*mut ibv_async_event);

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    /// Where the layouts are checked from: rdma-core's header (Debian: libibverbs-dev).
    const VERBS_H: &str = "/usr/include/infiniband/verbs.h";

    /// (C expression, Rust value) for every size and offset the provider relies on.
    fn facts() -> Vec<(&'static str, usize)> {
        macro_rules! off {
            ($t:ident, $($f:ident).+) => {
                (
                    concat!("offsetof(struct ", stringify!($t), ", ", stringify!($($f).+), ")"),
                    offset_of!($t, $($f).+),
                )
            };
        }
        macro_rules! size {
            ($t:ident) => {
                (
                    concat!("sizeof(struct ", stringify!($t), ")"),
                    size_of::<$t>(),
                )
            };
        }
        vec![
            off!(ibv_context_ops, poll_cq),
            off!(ibv_context_ops, req_notify_cq),
            off!(ibv_context_ops, post_srq_recv),
            off!(ibv_context_ops, post_send),
            off!(ibv_context_ops, post_recv),
            size!(ibv_context_ops),
            off!(ibv_context, ops),
            off!(ibv_context, cmd_fd),
            off!(ibv_context, async_fd),
            size!(ibv_port_attr),
            off!(ibv_port_attr, gid_tbl_len),
            off!(ibv_port_attr, link_layer),
            off!(ibv_port_attr, port_cap_flags2),
            size!(ibv_pd),
            size!(ibv_mr),
            off!(ibv_mr, lkey),
            off!(ibv_mr, rkey),
            off!(ibv_comp_channel, fd),
            off!(ibv_cq, cqe),
            off!(ibv_srq, handle),
            off!(ibv_qp, qp_num),
            off!(ibv_qp, qp_type),
            size!(ibv_qp_cap),
            size!(ibv_qp_init_attr),
            off!(ibv_qp_init_attr, cap),
            off!(ibv_qp_init_attr, sq_sig_all),
            size!(ibv_global_route),
            off!(ibv_global_route, traffic_class),
            size!(ibv_ah_attr),
            off!(ibv_ah_attr, is_global),
            off!(ibv_ah_attr, port_num),
            size!(ibv_qp_attr),
            off!(ibv_qp_attr, qp_access_flags),
            off!(ibv_qp_attr, cap),
            off!(ibv_qp_attr, ah_attr),
            off!(ibv_qp_attr, pkey_index),
            off!(ibv_qp_attr, max_rd_atomic),
            off!(ibv_qp_attr, port_num),
            off!(ibv_qp_attr, rnr_retry),
            off!(ibv_qp_attr, rate_limit),
            size!(ibv_sge),
            size!(ibv_send_wr),
            off!(ibv_send_wr, num_sge),
            off!(ibv_send_wr, imm_data),
            off!(ibv_send_wr, wr),
            off!(ibv_send_wr, wr.atomic.swap),
            off!(ibv_send_wr, wr.atomic.rkey),
            off!(ibv_send_wr, wr.ud.remote_qkey),
            (
                "offsetof(struct ibv_send_wr, qp_type)",
                offset_of!(ibv_send_wr, xrc_remote_srqn),
            ),
            size!(ibv_recv_wr),
            size!(ibv_wc),
            off!(ibv_wc, imm_data),
            off!(ibv_wc, wc_flags),
            off!(ibv_wc, dlid_path_bits),
            size!(ibv_srq_attr),
            size!(ibv_srq_init_attr),
            size!(ibv_async_event),
            off!(ibv_async_event, event_type),
        ]
    }

    /// Compiles a C program that prints each fact from `verbs.h` and compares it with the
    /// Rust declaration's.
    #[test]
    fn abi_matches_verbs_h() {
        assert!(
            std::path::Path::new(VERBS_H).exists(),
            "{VERBS_H} missing: install rdma-core's headers (Debian: libibverbs-dev) to \
             check the ABI"
        );
        let facts = facts();
        let dir = std::env::temp_dir().join(format!("monel-abi-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut c = String::from(
            "#include <stdio.h>\n#include <stddef.h>\n#include <infiniband/verbs.h>\nint main(void) {\n",
        );
        for (expr, _) in &facts {
            c.push_str(&format!("  printf(\"%zu\\n\", (size_t)({expr}));\n"));
        }
        c.push_str("  return 0;\n}\n");
        std::fs::write(dir.join("abi.c"), c).unwrap();
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
        let out = std::process::Command::new(&cc)
            .arg(dir.join("abi.c"))
            .arg("-o")
            .arg(dir.join("abi"))
            .output()
            .expect("a C compiler");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let run = std::process::Command::new(dir.join("abi"))
            .output()
            .unwrap();
        let got: Vec<usize> = String::from_utf8(run.stdout)
            .unwrap()
            .lines()
            .map(|l| l.parse().unwrap())
            .collect();
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(got.len(), facts.len());
        for ((expr, rust), c) in facts.iter().zip(got) {
            assert_eq!(*rust, c, "{expr}: Rust says {rust}, verbs.h says {c}");
        }
    }
}
