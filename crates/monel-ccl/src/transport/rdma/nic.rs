//! The NIC every RDMA link of a rank shares: which device, port and GID (NCCL's rules, through
//! `monel_peer::hca`), its protection domain, and caller memory registered with it.

use super::RdmaConfig;
use monel_peer::hca::{GidPolicy, choose_gid};
use monel_verbs::Provider;
use monel_verbs::protect::PacketAuth;
use monel_verbs::{
    AccessFlags, Context, ContextConfig, Device, Gid, MemoryRegion, Mtu, ProtectionDomain,
};
use std::io::{self};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError, Weak};

/// A soft RNIC opened for one rank: every RDMA link of the rank shares its progress thread.
pub(crate) struct Nic {
    pub(super) ctx: Arc<Context>,
    pub(super) pd: ProtectionDomain,
    pub(super) sgid_index: u8,
    pub(super) gid: Gid,
    pub(super) port: u16,
    pub(super) mtu: Mtu,
    /// Why this GID.
    pub(super) why: String,
    /// Caller memory registered with this NIC, held by its owners (windows).
    pub(super) registered: Mutex<Vec<Weak<Registered>>>,
}

/// Caller memory registered with a NIC: sends from it go to the NIC without a staging copy.
/// Its owner holds it and drops it before freeing the memory (deregistration waits for the
/// device, so no packet reads the memory afterwards).
pub(crate) struct Registered {
    pub(super) mr: MemoryRegion,
}

impl Registered {
    /// The region and `b`'s offset in it, when `b` lies inside.
    pub(super) fn offset_of(&self, b: &[u8]) -> Option<usize> {
        let (base, p) = (self.mr.addr() as usize, b.as_ptr() as usize);
        (p >= base && p + b.len() <= base + self.mr.len()).then(|| p - base)
    }
}

impl Nic {
    /// Opens the RNIC this rank uses: `cfg.device` when named; else the first port of a
    /// kernel RDMA device (`MONEL_IB_HCA` filters) that is up and has a GID the policy
    /// takes; else the soft RNIC on `local_ip`, on its own UDP port (ranks sharing an
    /// address each bind one; peers learn it in the handshake).
    pub(crate) fn open(cfg: &RdmaConfig, local_ip: IpAddr) -> Result<Self, String> {
        let (dev, chosen) = match &cfg.device {
            Some(d) => (
                Device::from_arg(d).map_err(|e| e.to_string())?,
                "MONEL_RDMA_DEV".to_string(),
            ),
            None => {
                match monel_verbs::rdma_core::device::first_usable(cfg.hca.as_ref(), &cfg.gid) {
                    Ok(found) => found,
                    Err(why) => {
                        tracing::info!(target: "monel::init", "soft RNIC: {why}");
                        let d = Device::bind(local_ip).map_err(|e| e.to_string())?;
                        (
                            d,
                            "the address this rank reaches the rendezvous from".into(),
                        )
                    }
                }
            }
        };
        let (sgid_index, why) = if dev.is_rdma_core() || cfg.gid != GidPolicy::default() {
            let port = match dev.provider {
                Provider::RdmaCore { port, .. } => port,
                Provider::Soft => 1,
            };
            let (g, why) = choose_gid(&dev.name, port, &dev.gid_slots(), &cfg.gid)?;
            (
                u8::try_from(g.index).map_err(|_| format!("GID index {} above 255", g.index))?,
                why,
            )
        } else {
            let i = dev
                .ipv4_gid_index()
                .filter(|_| local_ip.is_ipv4() || cfg.device.is_some())
                .unwrap_or(0);
            (i, chosen.clone())
        };
        let mtu = dev.port_attr().active_mtu;
        let ctx = Context::open(
            &dev,
            ContextConfig {
                udp_port: 0,
                gso: cfg.gso,
                ..ContextConfig::default()
            },
        )
        .map_err(|e| e.to_string())?;
        let gid = ctx.query_gid(sgid_index).map_err(|e| e.to_string())?.gid;
        let port = ctx
            .local_addr(sgid_index)
            .map_err(|e| e.to_string())?
            .port();
        let pd = ctx.alloc_pd();
        Ok(Self {
            ctx: Arc::new(ctx),
            pd,
            sgid_index,
            gid,
            port,
            mtu,
            why: if dev.is_rdma_core() {
                format!("{why}; device: {chosen}")
            } else {
                why
            },
            registered: Mutex::new(Vec::new()),
        })
    }

    /// Registers `[ptr, ptr + len)` for local reads, so writes from it go straight to the NIC.
    ///
    /// # Safety
    /// The memory must stay valid until the returned registration is dropped.
    #[allow(unsafe_code)]
    pub(crate) unsafe fn register(&self, ptr: *mut u8, len: usize) -> io::Result<Arc<Registered>> {
        // SAFETY: the caller keeps the memory valid while the registration lives, and the
        // NIC only reads it for writes whose callers leave it unchanged until they settle.
        let mr =
            unsafe { self.pd.reg_mr_raw(ptr, len, AccessFlags::NONE) }.map_err(io::Error::other)?;
        let r = Arc::new(Registered { mr });
        let mut all = self
            .registered
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        all.retain(|w| w.strong_count() > 0);
        all.push(Arc::downgrade(&r));
        Ok(r)
    }

    /// The live registration `b` lies in, if any.
    pub(super) fn registered(&self, b: &[u8]) -> Option<(Arc<Registered>, usize)> {
        let all = self
            .registered
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        all.iter()
            .filter_map(Weak::upgrade)
            .find_map(|r| r.offset_of(b).map(|off| (r, off)))
    }

    /// True on a kernel RDMA device (hardware, or rxe).
    pub(super) fn is_rdma_core(&self) -> bool {
        self.ctx.device().is_rdma_core()
    }

    /// The packet protection this rank offers: `cfg.auth` on the soft RNIC; none on a kernel
    /// device, whose NIC puts plain RoCEv2 on the wire (the fabric is trusted, as for NCCL).
    pub(super) fn auth(&self, cfg: &RdmaConfig) -> PacketAuth {
        if self.is_rdma_core() {
            PacketAuth::None
        } else {
            cfg.auth
        }
    }

    /// For logs: `provider P, dev NAME port N, GID i (why) G, udp P`.
    pub(crate) fn describe(&self) -> String {
        let d = self.ctx.device();
        let (provider, port) = match d.provider {
            Provider::RdmaCore { port, .. } => ("rdma-core", port),
            Provider::Soft => ("soft", 1),
        };
        format!(
            "provider {provider}, dev {} port {port}, GID {} ({}) {}, udp {}",
            d.name,
            self.sgid_index,
            self.why,
            gid_text(self.gid),
            self.port
        )
    }
}

/// A GID as people write it: `::ffff:10.0.0.2` for IPv4-mapped ones.
pub(super) fn gid_text(g: Gid) -> String {
    match g.to_ip() {
        IpAddr::V4(a) => format!("::ffff:{a}"),
        IpAddr::V6(a) => a.to_string(),
    }
}
