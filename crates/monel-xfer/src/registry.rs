//! Where agents find each other by name in a cluster: an etcd server (v3, through its JSON
//! gateway) holds `PREFIX/agents/NAME` -> "ip:port" for each live agent of a job, under a
//! lease the agent keeps alive; an agent that goes revokes its lease, and one that dies
//! disappears when the lease runs out. Only addresses go there: segment tables and keys
//! travel on the authenticated link, and an agent found by name must say that name when it
//! introduces itself ([`crate::Agent::connect_name`]). Names are claimed once: a second
//! agent of the same name in a job is refused while the first is registered.

use std::net::SocketAddr;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use serde_json::{Value, json};

use crate::error::{Result, XferError};

/// Agents one listing returns at most.
pub const MAX_AGENTS: usize = 4096;
/// Longest value read back (an address).
const MAX_VALUE: usize = 256;

/// An etcd endpoint and the job's key prefix.
#[derive(Debug, Clone)]
pub struct Registry {
    /// The etcd server's client URL (`http://host:port`; a bare `host:port` is taken as
    /// http).
    pub endpoint: String,
    /// The job's prefix: agents of one job see each other, and no one else.
    pub prefix: String,
    /// How long a registration outlives its agent's last keep-alive.
    pub ttl: Duration,
}

impl Registry {
    /// The registry of job `job` at `endpoint`, with a 10 s lease.
    pub fn new(endpoint: &str, job: &str) -> Self {
        let endpoint = if endpoint.contains("://") {
            endpoint.trim_end_matches('/').to_string()
        } else {
            format!("http://{endpoint}")
        };
        Self {
            endpoint,
            prefix: format!("monel/xfer/{job}"),
            ttl: Duration::from_secs(10),
        }
    }

    fn key(&self, name: &str) -> String {
        format!("{}/agents/{name}", self.prefix)
    }

    fn post(&self, path: &str, body: &Value) -> Result<Value> {
        let url = format!("{}{path}", self.endpoint);
        let err = |e: &dyn std::fmt::Display| XferError::Transport(format!("etcd {url}: {e}"));
        let resp = ureq::AgentBuilder::new()
            .timeout(Duration::from_secs(5))
            .build()
            .post(&url)
            .send_json(body)
            .map_err(|e| err(&e))?;
        // A registry's answers are small; a bigger one is not etcd's.
        let mut text = String::new();
        std::io::Read::read_to_string(
            &mut std::io::Read::take(resp.into_reader(), 4 << 20),
            &mut text,
        )
        .map_err(|e| err(&e))?;
        serde_json::from_str(&text).map_err(|e| err(&e))
    }

    /// A lease of [`Self::ttl`]; its id.
    pub fn grant(&self) -> Result<i64> {
        let r = self.post(
            "/v3/lease/grant",
            &json!({ "TTL": self.ttl.as_secs().max(1) }),
        )?;
        int(&r["ID"]).ok_or_else(|| bad("a lease grant without an ID"))
    }

    /// Renews lease `id`; an error once it has run out.
    pub fn keep_alive(&self, id: i64) -> Result<()> {
        let r = self.post("/v3/lease/keepalive", &json!({ "ID": id.to_string() }))?;
        match int(&r["result"]["TTL"]) {
            Some(t) if t > 0 => Ok(()),
            _ => Err(XferError::Transport(format!(
                "etcd lease {id:x} has run out"
            ))),
        }
    }

    /// Ends lease `id`: what it held goes at once.
    pub fn revoke(&self, id: i64) -> Result<()> {
        self.post("/v3/lease/revoke", &json!({ "ID": id.to_string() }))
            .map(drop)
    }

    /// Registers agent `name` at `addr` under lease `lease`; refused while another agent
    /// of that name is registered in the job.
    pub fn claim(&self, name: &str, addr: SocketAddr, lease: i64) -> Result<()> {
        let key = B64.encode(self.key(name));
        let r = self.post(
            "/v3/kv/txn",
            &json!({
                "compare": [{ "key": key, "target": "CREATE", "create_revision": "0" }],
                "success": [{ "request_put": {
                    "key": key,
                    "value": B64.encode(addr.to_string()),
                    "lease": lease.to_string(),
                } }],
            }),
        )?;
        if r["succeeded"].as_bool() == Some(true) {
            Ok(())
        } else {
            Err(XferError::Duplicate(format!(
                "agent {name:?} (registered in {} already)",
                self.prefix
            )))
        }
    }

    /// Where agent `name` of the job listens, if it is registered.
    pub fn lookup(&self, name: &str) -> Result<Option<SocketAddr>> {
        let r = self.post(
            "/v3/kv/range",
            &json!({ "key": B64.encode(self.key(name)) }),
        )?;
        match r["kvs"].as_array().and_then(|k| k.first()) {
            None => Ok(None),
            Some(kv) => addr_of(kv).map(Some),
        }
    }

    /// Every registered agent of the job: (name, address), at most [`MAX_AGENTS`].
    pub fn agents(&self) -> Result<Vec<(String, SocketAddr)>> {
        let from = self.key("");
        // The range [from, from with its last byte + 1): every key under the prefix.
        let mut end = from.clone().into_bytes();
        *end.last_mut().expect("not empty") += 1;
        let r = self.post(
            "/v3/kv/range",
            &json!({
                "key": B64.encode(&from),
                "range_end": B64.encode(&end),
                "limit": MAX_AGENTS,
            }),
        )?;
        let Some(kvs) = r["kvs"].as_array() else {
            return Ok(Vec::new());
        };
        kvs.iter()
            .take(MAX_AGENTS)
            .map(|kv| {
                let key = b64(&kv["key"], 1024)?;
                let name = key
                    .strip_prefix(from.as_bytes())
                    .and_then(|n| String::from_utf8(n.to_vec()).ok())
                    .ok_or_else(|| bad("a key outside the job's prefix"))?;
                Ok((name, addr_of(kv)?))
            })
            .collect()
    }
}

fn bad(why: &str) -> XferError {
    XferError::BadMessage(format!("etcd: {why}"))
}

/// etcd's 64-bit integers come as strings in its JSON.
fn int(v: &Value) -> Option<i64> {
    v.as_str()
        .and_then(|s| s.parse().ok())
        .or_else(|| v.as_i64())
}

fn b64(v: &Value, max: usize) -> Result<Vec<u8>> {
    let s = v
        .as_str()
        .ok_or_else(|| bad("a key or value that is not a string"))?;
    if s.len() > max * 4 / 3 + 4 {
        return Err(bad("a key or value over its bound"));
    }
    B64.decode(s)
        .map_err(|_| bad("a key or value that is not base64"))
}

fn addr_of(kv: &Value) -> Result<SocketAddr> {
    let v = b64(&kv["value"], MAX_VALUE)?;
    std::str::from_utf8(&v)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("a registered address that is not ip:port"))
}
