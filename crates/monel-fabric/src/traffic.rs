//! Arbitrary traffic: a list of flows between GPUs, each with a start time or the flows it
//! waits for, and optionally the spine it must cross. Read from Monel's own CSV format or
//! from htsim's connection-matrix format (`.cm`), both hostile input: every count, index
//! and size is bounded before anything is allocated for it.
//!
//! Monel's format, one flow per line after a header naming the columns:
//!
//! ```text
//! from,to,bytes,start_us,after,spine
//! 0,31,4MiB,0,,
//! 1,3,4194304,0,,2        # pinned to spine 2
//! 3,4,1MiB,,0;1,          # starts once flows 0 and 1 (0-based rows) are delivered
//! ```
//!
//! `start_us` is empty when `after` is given; `after` and `spine` may be empty or missing.
//! `#` starts a comment.

use std::collections::HashMap;
use std::fmt;

use crate::cluster::Cluster;
use crate::engine::flow::check_dependencies;
use crate::units::parse_bytes;

/// Most flows a traffic file may hold.
pub const MAX_FLOWS: usize = 1 << 22;
/// Most flows one flow may wait for.
pub const MAX_AFTER: usize = 1 << 16;

/// One flow of a traffic list.
#[derive(Debug, Clone, PartialEq)]
pub struct TrafficFlow {
    /// Sending GPU.
    pub from: usize,
    /// Receiving GPU.
    pub to: usize,
    /// Bytes.
    pub bytes: u64,
    /// When it may start, seconds (after its dependencies, when it has any).
    pub start_s: f64,
    /// Flows (indices into the list) that must be delivered before it starts.
    pub after: Vec<usize>,
    /// The spine (top-tier switch) it must cross, if pinned.
    pub spine: Option<usize>,
}

/// A traffic file's mistake: the line (1-based; 0 for the whole file) and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrafficError {
    /// 1-based line, or 0 when the mistake is not on one line.
    pub line: usize,
    /// What is wrong, and what is allowed.
    pub why: String,
}

impl fmt::Display for TrafficError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(f, "traffic: {}", self.why)
        } else {
            write!(f, "traffic line {}: {}", self.line, self.why)
        }
    }
}

impl std::error::Error for TrafficError {}

fn bad<T>(line: usize, why: impl Into<String>) -> Result<T, TrafficError> {
    Err(TrafficError {
        line,
        why: why.into(),
    })
}

fn index(s: &str, what: &str, line: usize) -> Result<usize, TrafficError> {
    match s.trim().parse::<usize>() {
        Ok(v) => Ok(v),
        Err(_) => bad(line, format!("{what} {s:?}: want a whole number from 0")),
    }
}

fn micros(s: &str, line: usize) -> Result<f64, TrafficError> {
    match s.trim().parse::<f64>() {
        Ok(v) if v >= 0.0 && v.is_finite() => Ok(v / 1e6),
        _ => bad(line, format!("start {s:?}: want microseconds from 0")),
    }
}

fn size(s: &str, line: usize) -> Result<u64, TrafficError> {
    let s = s.trim();
    s.parse::<u64>()
        .or_else(|_| parse_bytes(s))
        .or_else(|e| bad(line, e.to_string()))
}

/// Reads Monel's CSV traffic format (see the module's documentation).
pub fn parse_csv(text: &str) -> Result<Vec<TrafficFlow>, TrafficError> {
    let mut lines = text
        .lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l.split('#').next().unwrap_or("").trim()))
        .filter(|(_, l)| !l.is_empty());
    let Some((hl, header)) = lines.next() else {
        return bad(
            0,
            "empty: want a header `from,to,bytes,start_us,after,spine`",
        );
    };
    let cols: Vec<&str> = header.split(',').map(str::trim).collect();
    let col = |name: &str| cols.iter().position(|c| *c == name);
    let (Some(cf), Some(ct), Some(cb)) = (col("from"), col("to"), col("bytes")) else {
        return bad(
            hl,
            "the header must name from, to and bytes (and start_us, after, spine)",
        );
    };
    if let Some(c) = cols
        .iter()
        .find(|c| !["from", "to", "bytes", "start_us", "after", "spine"].contains(c))
    {
        return bad(
            hl,
            format!("unknown column {c:?}: want from, to, bytes, start_us, after, spine"),
        );
    }
    let (cs, ca, cp) = (col("start_us"), col("after"), col("spine"));
    let mut flows = Vec::new();
    for (n, l) in lines {
        if flows.len() == MAX_FLOWS {
            return bad(n, format!("more than {MAX_FLOWS} flows"));
        }
        let f: Vec<&str> = l.split(',').map(str::trim).collect();
        if f.len() > cols.len() {
            return bad(
                n,
                format!("{} fields, the header names {}", f.len(), cols.len()),
            );
        }
        let get = |c: Option<usize>| c.and_then(|c| f.get(c)).copied().unwrap_or("");
        let after: Vec<usize> = if get(ca).is_empty() {
            Vec::new()
        } else {
            let parts: Vec<&str> = get(ca).split(';').collect();
            if parts.len() > MAX_AFTER {
                return bad(n, format!("waits for more than {MAX_AFTER} flows"));
            }
            parts
                .iter()
                .map(|p| index(p, "after", n))
                .collect::<Result<_, _>>()?
        };
        let start_s = match (get(cs).is_empty(), after.is_empty()) {
            (true, false) => 0.0,
            (true, true) => return bad(n, "no start_us and no after: want one of them"),
            (false, _) => micros(get(cs), n)?,
        };
        let spine = match get(cp) {
            "" => None,
            s => Some(index(s, "spine", n)?),
        };
        flows.push(TrafficFlow {
            from: index(get(Some(cf)), "from", n)?,
            to: index(get(Some(ct)), "to", n)?,
            bytes: size(get(Some(cb)), n)?,
            start_s,
            after,
            spine,
        });
    }
    check_order(&flows)?;
    Ok(flows)
}

/// Reads htsim's connection-matrix format: `Nodes N`, `Connections C`, `Triggers T`, lines
/// `a->b [id i] [start us] size bytes [trigger t] [send_done_trigger t] [recv_done_trigger
/// t]` and `trigger id t oneshot|barrier k`. A flow started by a trigger waits for the flows
/// that fire it (one for `oneshot`, all `k` for `barrier k`); "done" is delivery in Monel
/// (htsim's `send_done_trigger` fires on the sender's last acknowledgement, one return trip
/// later). Returns the flows and `Nodes`.
pub fn parse_cm(text: &str) -> Result<(Vec<TrafficFlow>, usize), TrafficError> {
    let mut nodes = None;
    let mut flows: Vec<TrafficFlow> = Vec::new();
    // Per flow: the trigger starting it; per trigger: its kind and the flows firing it.
    let mut started_by: Vec<Option<u64>> = Vec::new();
    let mut fired_by: HashMap<u64, Vec<usize>> = HashMap::new();
    let mut kinds: HashMap<u64, (usize, Option<usize>)> = HashMap::new();
    let mut ids: HashMap<u64, usize> = HashMap::new();
    for (i, raw) in text.lines().enumerate() {
        let n = i + 1;
        let w: Vec<&str> = raw.split_whitespace().collect();
        match w.as_slice() {
            [] => {}
            ["Nodes", v] => nodes = Some(index(v, "Nodes", n)?),
            ["Connections", _] | ["Triggers", _] | ["Failures", _] => {}
            ["trigger", "id", t, kind, rest @ ..] => {
                let t = index(t, "trigger id", n)? as u64;
                let need = match (*kind, rest) {
                    ("oneshot", []) => None,
                    ("barrier", [k]) => Some(index(k, "barrier count", n)?),
                    _ => return bad(n, "want `trigger id T oneshot` or `trigger id T barrier K`"),
                };
                if kinds.insert(t, (n, need)).is_some() {
                    return bad(n, format!("trigger {t} declared twice"));
                }
            }
            [conn, rest @ ..] if conn.contains("->") => {
                if flows.len() == MAX_FLOWS {
                    return bad(n, format!("more than {MAX_FLOWS} connections"));
                }
                let (a, b) = conn.split_once("->").unwrap_or(("", ""));
                let (from, to) = (index(a, "source", n)?, index(b, "destination", n)?);
                let (mut start, mut bytes, mut trig) = (None, None, None);
                let mut it = rest.iter();
                while let Some(key) = it.next() {
                    let Some(v) = it.next() else {
                        return bad(n, format!("{key} without a value"));
                    };
                    match *key {
                        "start" => start = Some(micros(v, n)?),
                        "size" => bytes = Some(size(v, n)?),
                        "id" => {
                            if ids.insert(index(v, "id", n)? as u64, flows.len()).is_some() {
                                return bad(n, format!("id {v} used twice"));
                            }
                        }
                        "trigger" => trig = Some(index(v, "trigger", n)? as u64),
                        "send_done_trigger" | "recv_done_trigger" => {
                            let t = index(v, key, n)? as u64;
                            let list = fired_by.entry(t).or_default();
                            if list.len() == MAX_AFTER {
                                return bad(
                                    n,
                                    format!("trigger {t} fired by over {MAX_AFTER} flows"),
                                );
                            }
                            list.push(flows.len());
                        }
                        _ => return bad(n, format!("unknown field {key:?}")),
                    }
                }
                let Some(bytes) = bytes else {
                    return bad(n, "no size");
                };
                if start.is_none() && trig.is_none() {
                    return bad(n, "neither start nor trigger");
                }
                started_by.push(trig);
                flows.push(TrafficFlow {
                    from,
                    to,
                    bytes,
                    start_s: start.unwrap_or(0.0),
                    after: Vec::new(),
                    spine: None,
                });
            }
            _ => return bad(n, format!("unknown line {:?}", raw.trim())),
        }
    }
    let Some(nodes) = nodes else {
        return bad(0, "no `Nodes N` line");
    };
    for (i, t) in started_by.iter().enumerate() {
        let Some(t) = t else { continue };
        let Some(&(line, need)) = kinds.get(t) else {
            return bad(
                0,
                format!("connection {} waits for trigger {t}, never declared", i + 1),
            );
        };
        let firing = fired_by.get(t).map_or(&[][..], Vec::as_slice);
        match need {
            None if firing.len() != 1 => {
                return bad(
                    line,
                    format!(
                        "oneshot trigger {t} fired by {} flows: want exactly one",
                        firing.len()
                    ),
                );
            }
            Some(k) if firing.len() != k => {
                return bad(
                    line,
                    format!("barrier trigger {t} of {k} fired by {} flows", firing.len()),
                );
            }
            _ => {}
        }
        flows[i].after = firing.to_vec();
    }
    for f in &flows {
        if f.from >= nodes || f.to >= nodes {
            return bad(
                0,
                format!("connection {}->{} outside the {nodes} nodes", f.from, f.to),
            );
        }
    }
    check_order(&flows)?;
    Ok((flows, nodes))
}

/// Every dependency names a flow of the list, and no flow waits on itself through others.
pub(crate) fn check_order(flows: &[TrafficFlow]) -> Result<(), TrafficError> {
    check_dependencies(flows.len(), |i| &flows[i].after).or_else(|e| bad(0, e.to_string()))
}

/// Reads htsim's per-flow spine log lines `SRC DST SPINE` (one flow per pair): the spine
/// each listed flow must cross.
pub fn parse_pins(text: &str) -> Result<HashMap<(usize, usize), usize>, TrafficError> {
    let mut pins = HashMap::new();
    for (i, l) in text.lines().enumerate() {
        let w: Vec<&str> = l
            .split('#')
            .next()
            .unwrap_or("")
            .split_whitespace()
            .collect();
        match w.as_slice() {
            [] => {}
            [a, b, s] => {
                if pins.len() == MAX_FLOWS {
                    return bad(i + 1, format!("more than {MAX_FLOWS} pins"));
                }
                pins.insert(
                    (index(a, "source", i + 1)?, index(b, "destination", i + 1)?),
                    index(s, "spine", i + 1)?,
                );
            }
            _ => return bad(i + 1, "want `SOURCE DESTINATION SPINE`"),
        }
    }
    Ok(pins)
}

/// A UDP source port whose ECMP hash takes the flow from GPU `a` to GPU `b` over `spine`,
/// or `None` if no port does (the spine is not on any of its paths).
pub fn sport_for_spine(cluster: &Cluster, a: usize, b: usize, spine: usize) -> Option<u16> {
    (0..=u16::MAX).find(|&s| cluster.spine_of(a, b, None, s) == Some(spine))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_monel_csv_with_units_dependencies_and_pins() {
        let f = parse_csv(
            "from,to,bytes,start_us,after,spine  # header\n\
             0,31,4MiB,0,,\n\
             \n\
             1,3,4096,2.5,,2\n\
             3,4,1KiB,,0;1,\n\
             5,6,10,7,1\n",
        )
        .unwrap();
        assert_eq!(f.len(), 4);
        assert_eq!((f[0].bytes, f[0].start_s, f[0].spine), (4 << 20, 0.0, None));
        assert_eq!((f[1].start_s, f[1].spine), (2.5e-6, Some(2)));
        assert_eq!((f[2].after.clone(), f[2].bytes), (vec![0, 1], 1024));
        assert_eq!((f[3].after.clone(), f[3].start_s), (vec![1], 7e-6));
        // Columns in any order, the optional ones left out.
        let g = parse_csv("bytes,to,from,start_us\n8,1,0,0\n").unwrap();
        assert_eq!((g[0].from, g[0].to, g[0].bytes), (0, 1, 8));
    }

    #[test]
    fn bad_csv_is_a_typed_error_naming_the_line() {
        for (text, line, says) in [
            ("", 0, "header"),
            ("from,to\n0,1\n", 1, "bytes"),
            ("from,to,bytes,colour\n", 1, "unknown column"),
            ("from,to,bytes,start_us\n0,1,8\n", 2, "no start_us"),
            ("from,to,bytes,start_us\n0,1,8,-1\n", 2, "start"),
            ("from,to,bytes,start_us\n0,x,8,0\n", 2, "to"),
            ("from,to,bytes,start_us\n0,1,1.5B,0\n", 2, "whole number"),
            ("from,to,bytes,start_us\n0,1,8,0,9\n", 2, "fields"),
            ("from,to,bytes,after\n0,1,8,1\n1,0,8,0\n", 0, "cycle"),
            ("from,to,bytes,after\n0,1,8,0\n", 0, "cycle"),
            ("from,to,bytes,after\n0,1,8,5\n", 0, "waits for flow 5"),
        ] {
            let e = parse_csv(text).unwrap_err();
            assert_eq!(e.line, line, "{text:?}: {e}");
            assert!(e.to_string().contains(says), "{text:?}: {e}");
        }
    }

    #[test]
    fn reads_htsim_connection_matrices_with_triggers() {
        let (f, nodes) = parse_cm(
            "Nodes 4\nConnections 4\nTriggers 2\n\
             0->1 id 1 start 0 size 1048576 send_done_trigger 1\n\
             1->2 id 2 trigger 1 size 1048576 send_done_trigger 2\n\
             2->3 id 3 start 5 size 8 send_done_trigger 2\n\
             3->0 id 4 trigger 2 size 8\n\
             trigger id 1 oneshot\ntrigger id 2 barrier 2\n",
        )
        .unwrap();
        assert_eq!(nodes, 4);
        assert_eq!(f[0].after, Vec::<usize>::new());
        assert_eq!(f[1].after, vec![0]);
        assert_eq!(f[2].start_s, 5e-6);
        assert_eq!(f[3].after, vec![1, 2]);
    }

    #[test]
    fn bad_connection_matrices_are_typed_errors() {
        for (text, says) in [
            ("Connections 1\n0->1 start 0 size 8\n", "Nodes"),
            ("Nodes 2\n0->5 start 0 size 8\n", "outside"),
            ("Nodes 2\n0->1 start 0\n", "no size"),
            ("Nodes 2\n0->1 size 8\n", "neither start nor trigger"),
            ("Nodes 2\n0->1 start 0 size 8 colour red\n", "unknown field"),
            ("Nodes 2\n0->1 start 0 size\n", "without a value"),
            ("Nodes 2\n0->1 trigger 3 size 8\n", "never declared"),
            (
                "Nodes 2\n0->1 start 0 size 8 send_done_trigger 1\n\
                 1->0 start 0 size 8 send_done_trigger 1\n\
                 0->1 trigger 1 size 8\ntrigger id 1 oneshot\n",
                "exactly one",
            ),
            (
                "Nodes 2\n0->1 id 1 trigger 1 size 8 send_done_trigger 1\ntrigger id 1 oneshot\n",
                "cycle",
            ),
            ("Nodes 2\nfly me to the moon\n", "unknown line"),
            (
                "Nodes 2\n0->1 id 1 start 0 size 8\n1->0 id 1 start 0 size 8\n",
                "twice",
            ),
        ] {
            let e = parse_cm(text).unwrap_err();
            assert!(e.to_string().contains(says), "{text:?}: {e}");
        }
    }

    #[test]
    fn pins_read_htsim_spine_lines() {
        let p = parse_pins("0 31 2\n# note\n\n4 0 1\n").unwrap();
        assert_eq!(p.len(), 2);
        assert_eq!(p[&(0, 31)], 2);
        assert!(parse_pins("0 31\n").is_err());
        assert!(parse_pins("0 31 x\n").is_err());
    }
}
