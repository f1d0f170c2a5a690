//! The hierarchical AllReduce: rings inside hosts, a ring between them.

use std::ops::Range;

use super::*;

/// AllReduce across hosts, hierarchical (NCCL's tree and CollNet idea on rings): the ranks
/// sit host by host, `per_host` on each (positions `h * per_host ..`); each host first
/// reduce-scatters the vector over its own ranks (a ring inside the host), then the ranks
/// holding the same part on every host all-reduce it with a ring between the hosts, then
/// each host all-gathers the parts over its own ranks. A host sends `2 (H-1)/H` of the
/// vector between hosts (H hosts), where a flat ring sends `2 (n-1)/n` of it over each
/// crossing hop; inside a host each rank sends `2 (L-1)/L` of it (L ranks a host), more than
/// the flat ring's hops inside a host carry. Pipelined in pieces as
/// [`allreduce_ring_pipelined`]. With `per_host` 0, 1, `n` or not dividing `n` there is no
/// hierarchy and this is that ring.
pub fn allreduce_hier(
    n: usize,
    r: usize,
    count: usize,
    slice: usize,
    avg: bool,
    per_host: usize,
) -> Schedule {
    if per_host == 0 || n % per_host != 0 || per_host == n || per_host == 1 {
        return allreduce_ring_pipelined(n, r, count, slice, avg);
    }
    in_pieces(n, count, slice, |len| {
        hier_piece(n / per_host, per_host, r, len, avg)
    })
}

/// One piece of [`allreduce_hier`]: `hosts` hosts of `local` ranks, position `p`.
pub(super) fn hier_piece(
    hosts: usize,
    local: usize,
    p: usize,
    count: usize,
    avg: bool,
) -> Schedule {
    let (h, l) = (p / local, p % local);
    let mut s = Schedule::default();
    // Steps built among `m` ranks, numbered 0..m, then put at their positions.
    let append = |s: &mut Schedule, mut t: Schedule, at: &[usize]| {
        t.relabel(at);
        s.steps.append(&mut t.steps);
    };
    let in_host: Vec<usize> = (0..local).map(|i| h * local + i).collect();
    let across: Vec<usize> = (0..hosts).map(|j| j * local + l).collect();
    // Inside the host: chunk l of the vector, reduced over the host, lands in Output.
    let chunks = split(count, local);
    let mut t = Schedule::default();
    ring_reduce_scatter_steps(
        &mut t,
        local,
        l,
        &chunks,
        &RingRs {
            acc: Buf::Input,
            slot: output_slot,
            last: Span::of(Buf::Output, chunks[l].clone()),
        },
    );
    append(&mut s, t, &in_host);
    // Between hosts: a ring all-reduce of chunk l, in place in Output.
    let mine = &chunks[l];
    let parts: Vec<Range<usize>> = split(mine.len(), hosts)
        .into_iter()
        .map(|x| x.start + mine.start..x.end + mine.start)
        .collect();
    let mut t = Schedule::default();
    ring_reduce_scatter_steps(
        &mut t,
        hosts,
        h,
        &parts,
        &RingRs {
            acc: Buf::Output,
            slot: output_slot,
            last: Span::of(Buf::Output, parts[h].clone()),
        },
    );
    finish_avg(&mut t, avg, Span::of(Buf::Output, parts[h].clone()));
    ring_all_gather_steps(&mut t, hosts, h, &parts, Buf::Output);
    append(&mut s, t, &across);
    // Inside the host again: every chunk to every rank.
    let mut t = Schedule::default();
    ring_all_gather_steps(&mut t, local, l, &chunks, Buf::Output);
    append(&mut s, t, &in_host);
    s
}
