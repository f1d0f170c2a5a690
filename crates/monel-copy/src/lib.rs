//! Bulk copies that dodge 4 KiB aliasing.
//!
//! glibc's `memcpy` moves large blocks with `rep movsb`, and on recent Intel cores that runs
//! 3-10x slower when the destination lies just after the source modulo 4 KiB (by 1 to 31
//! bytes): each load then looks like it depends on the store issued just before it, whose
//! address has the same low 12 bits. Measured on the project's 2-core VM, 64 KiB pieces:
//! about 36 GB/s apart from that band, 3.5-11 GB/s inside it.
//!
//! Collectives can hit the band by chance: a frame header shifts where the next payload
//! lands in a shared-memory ring, so a rank's copies into and out of its rings fall in or
//! out of it from one call to the next. (How often that costs a collective measurably was
//! not separated from the VM's slow cross-core spells, which [`Adaptive`] answers.)
//! [`copy`] copies such pairs backwards instead, where a load never follows a store to the
//! same low address bits, and hands every other pair to `memcpy`.

/// Copies shorter than this go straight to `memcpy` (too short for the band to matter).
const MIN: usize = 2048;

/// True when `dst` lies 1 to 31 bytes after `src` modulo 4 KiB (the slow band).
fn aliases(dst: *const u8, src: *const u8) -> bool {
    let d = (dst as usize).wrapping_sub(src as usize) & 4095;
    (1..32).contains(&d)
}

/// `dst.copy_from_slice(src)`, at full speed whatever the two addresses (see the module
/// docs). Panics, as `copy_from_slice` does, when the lengths differ.
pub fn copy(dst: &mut [u8], src: &[u8]) {
    assert_eq!(
        dst.len(),
        src.len(),
        "copy between slices of different lengths"
    );
    if dst.len() < MIN || !aliases(dst.as_ptr(), src.as_ptr()) {
        dst.copy_from_slice(src);
        return;
    }
    backward(dst, src);
}

/// Copies from the end down, in vector steps with explicit loads and stores (a plain loop
/// of slice copies is turned back into one forward `memcpy` by the compiler).
#[cfg(target_arch = "x86_64")]
fn backward(dst: &mut [u8], src: &[u8]) {
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked just above).
        #[allow(unsafe_code)]
        unsafe {
            backward_avx2(dst, src);
        }
    } else {
        backward_sse2(dst, src);
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn backward(dst: &mut [u8], src: &[u8]) {
    dst.copy_from_slice(src);
}

/// 128 bytes a step, in 32-byte moves.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
#[target_feature(enable = "avx2")]
fn backward_avx2(dst: &mut [u8], src: &[u8]) {
    use std::arch::x86_64::{__m256i, _mm256_loadu_si256, _mm256_storeu_si256};
    let head = dst.len() % 128;
    let (dh, dt) = dst.split_at_mut(head);
    let (sh, st) = src.split_at(head);
    for (d, s) in dt
        .chunks_exact_mut(128)
        .rev()
        .zip(st.chunks_exact(128).rev())
    {
        let p = s.as_ptr().cast::<__m256i>();
        let q = d.as_mut_ptr().cast::<__m256i>();
        // SAFETY: `s` and `d` are 128 bytes each (exact chunks), so the four 32-byte
        // unaligned loads and stores stay inside them; AVX2 is enabled on this function.
        unsafe {
            let v = [
                _mm256_loadu_si256(p),
                _mm256_loadu_si256(p.add(1)),
                _mm256_loadu_si256(p.add(2)),
                _mm256_loadu_si256(p.add(3)),
            ];
            for (k, x) in v.into_iter().enumerate() {
                _mm256_storeu_si256(q.add(k), x);
            }
        }
    }
    dh.copy_from_slice(sh);
}

/// 64 bytes a step, in 16-byte moves (SSE2: every x86-64 has it).
#[cfg(target_arch = "x86_64")]
fn backward_sse2(dst: &mut [u8], src: &[u8]) {
    let head = dst.len() % 64;
    let (dh, dt) = dst.split_at_mut(head);
    let (sh, st) = src.split_at(head);
    for (d, s) in dt.chunks_exact_mut(64).rev().zip(st.chunks_exact(64).rev()) {
        step64(d, s, false);
    }
    dh.copy_from_slice(sh);
}

/// Moves 64 bytes from `s` to `d` in four 16-byte steps (SSE2: every x86-64 has it):
/// unaligned loads, then plain stores or (`stream`) streaming ones, which need `d` on a
/// 16-byte boundary.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn step64(d: &mut [u8], s: &[u8], stream: bool) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_storeu_si128, _mm_stream_si128};
    assert!(d.len() == 64 && s.len() == 64, "64-byte steps");
    assert!(
        !stream || d.as_ptr().align_offset(16) == 0,
        "streaming stores need alignment"
    );
    let p = s.as_ptr().cast::<__m128i>();
    let q = d.as_mut_ptr().cast::<__m128i>();
    // SAFETY: `s` and `d` are 64 bytes each (asserted), so the four 16-byte loads stay
    // inside `s` and the four stores inside `d`; streaming stores get the 16-byte alignment
    // they require (asserted); SSE2 is part of x86-64.
    #[allow(unsafe_code)]
    unsafe {
        let v = [
            _mm_loadu_si128(p),
            _mm_loadu_si128(p.add(1)),
            _mm_loadu_si128(p.add(2)),
            _mm_loadu_si128(p.add(3)),
        ];
        for (k, x) in v.into_iter().enumerate() {
            if stream {
                _mm_stream_si128(q.add(k), x);
            } else {
                _mm_storeu_si128(q.add(k), x);
            }
        }
    }
}

/// Copies shorter than this go to [`copy`] in [`stream`] (a streaming store pays off only
/// on bulk data, and small messages want to stay in cache for a reader that polls them).
pub const STREAM_MIN: usize = 4096;

/// `dst.copy_from_slice(src)` with non-temporal stores, for bytes another core reads next
/// (a shared-memory ring): they go to memory instead of sitting modified in this core's
/// cache, where the reader's core would have to fetch them line by line.
///
/// Measured on the project's 2-core VM, a 1 MiB ring between two pinned threads: with
/// `memcpy` 10 GB/s in good spells but 2.3-4.4 GB/s in the long spells (about half the
/// time) when moving lines between the two cores is slow; streaming 8.5 GB/s and 10-16 GB/s.
/// Ends with a store fence, so a later release store (the ring's head) publishes the bytes.
pub fn stream(dst: &mut [u8], src: &[u8]) {
    assert_eq!(
        dst.len(),
        src.len(),
        "copy between slices of different lengths"
    );
    if dst.len() < STREAM_MIN {
        copy(dst, src);
        return;
    }
    stream_bulk(dst, src);
}

/// Chooses how to copy into memory that another core reads next (a shared-memory ring):
/// with plain or with streaming stores, whichever costs the writer and the reader less
/// together, as both measure it now.
///
/// Neither wins always on the project's VM. In good spells plain stores leave the bytes in
/// cache for the reader and are about twice as fast (2 ranks, 1 MiB AllReduce: 61 us
/// against 120 us); in the spells when moving lines between the cores is slow, streaming
/// is three times as fast (about 120 us against 330-520 us). The writer alone cannot tell:
/// streaming stores are fast for it in both spells, the reader pays for them in good ones.
/// So the writer times its copies ([`Self::copy`]), the reader times its reads of the bytes
/// each way ([`Costs`], shared between them), the cheaper sum is kept, and one copy in 32
/// tries the other way.
#[derive(Debug, Default)]
pub struct Adaptive {
    /// The writer's nanoseconds per KiB by way (0: plain, 1: streaming); 0.0 until tried.
    own: Costs,
    copies: u32,
}

/// Nanoseconds per KiB by way (0: plain, 1: streaming), smoothed; 0.0 until measured.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct Costs(pub [f64; 2]);

impl Costs {
    /// Folds in one measurement of `bytes` moved in `ns` the given way.
    pub fn add(&mut self, way: usize, bytes: usize, ns: u128) {
        let x = ns as f64 * 1024.0 / bytes.max(1) as f64;
        let c = &mut self.0[way];
        // A copy the scheduler interrupted counts as at most four times the estimate, so
        // one preemption does not swing the choice for long.
        *c = if *c == 0.0 {
            x
        } else {
            0.75 * *c + 0.25 * x.min(4.0 * *c)
        };
    }
}

/// One timed copy in this many tries the way that is not in favour.
const EXPLORE: u32 = 32;

impl Adaptive {
    /// `dst.copy_from_slice(src)` (the lengths must match), the way the costs favour given
    /// the reader's `reader` costs; returns the way taken (0: plain, 1: streaming).
    pub fn copy(&mut self, dst: &mut [u8], src: &[u8], reader: Costs) -> usize {
        if dst.len() < STREAM_MIN {
            copy(dst, src);
            return 0;
        }
        let way = self.way(reader);
        let t = std::time::Instant::now();
        if way == 0 {
            copy(dst, src);
        } else {
            stream(dst, src);
        }
        self.own.add(way, dst.len(), t.elapsed().as_nanos());
        way
    }

    /// The way the next copy takes: each way until both sides measured it, then the
    /// cheaper, but the other one every [`EXPLORE`]th time.
    fn way(&mut self, reader: Costs) -> usize {
        self.copies = self.copies.wrapping_add(1);
        let known = |w: usize| self.own.0[w] > 0.0 && reader.0[w] > 0.0;
        if !known(0) {
            return 0;
        }
        if !known(1) {
            return 1;
        }
        let best = self.favoured(reader);
        if self.copies % EXPLORE == 0 {
            1 - best
        } else {
            best
        }
    }

    /// The writer's own costs so far.
    pub fn own(&self) -> Costs {
        self.own
    }

    /// The way in favour now (0: plain, 1: streaming).
    pub fn favoured(&self, reader: Costs) -> usize {
        let sum = |w: usize| self.own.0[w] + reader.0[w];
        usize::from(sum(1) < sum(0))
    }
}

#[cfg(target_arch = "x86_64")]
fn stream_bulk(dst: &mut [u8], src: &[u8]) {
    use std::arch::x86_64::_mm_sfence;
    // Up to the first 64-byte boundary of the destination, and the tail, by plain copies.
    let head = dst.as_ptr().align_offset(64).min(dst.len());
    let (dh, rest) = dst.split_at_mut(head);
    let (sh, srest) = src.split_at(head);
    dh.copy_from_slice(sh);
    let body = rest.len() - rest.len() % 64;
    let (db, dt) = rest.split_at_mut(body);
    let (sb, st) = srest.split_at(body);
    for (d, s) in db.chunks_exact_mut(64).zip(sb.chunks_exact(64)) {
        step64(d, s, true);
    }
    dt.copy_from_slice(st);
    // SAFETY: a store fence has no memory-safety preconditions.
    #[allow(unsafe_code)]
    unsafe {
        _mm_sfence();
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn stream_bulk(dst: &mut [u8], src: &[u8]) {
    dst.copy_from_slice(src);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `f` as a copy between every pair of offsets and every length given, checking
    /// the bytes copied and that nothing around the destination was touched.
    fn copies_exactly(
        f: impl Fn(&mut [u8], &[u8]),
        offsets: (&[usize], &[usize]),
        lens: &[usize],
        what: &str,
    ) {
        let src: Vec<u8> = (0..40_000u32).map(|i| (i * 13 + i / 97) as u8).collect();
        let mut dst = vec![0u8; 40_000];
        for &so in offsets.0 {
            for &dof in offsets.1 {
                for &len in lens {
                    dst.fill(0xee);
                    f(&mut dst[dof..dof + len], &src[so..so + len]);
                    let at = format!("{what}: {so} {dof} {len}");
                    assert_eq!(&dst[dof..dof + len], &src[so..so + len], "{at}");
                    assert!(dst[..dof].iter().all(|&b| b == 0xee), "wrote before: {at}");
                    assert!(
                        dst[dof + len..].iter().all(|&b| b == 0xee),
                        "wrote after: {at}"
                    );
                }
            }
        }
    }

    #[test]
    fn every_offset_and_length_copies_exactly() {
        let offsets: (&[usize], &[usize]) =
            (&[0, 1, 8, 16, 31, 63], &[0, 1, 8, 16, 24, 31, 32, 40, 4097]);
        let lens = [0, 1, 63, 64, 65, 2047, 2048, 2049, 4096 + 17, 8000];
        copies_exactly(copy, offsets, &lens, "copy");
        // The backward paths whatever the addresses (copy takes them only in the band).
        copies_exactly(backward, offsets, &lens, "backward");
        #[cfg(target_arch = "x86_64")]
        copies_exactly(backward_sse2, offsets, &lens, "backward_sse2");
    }

    #[test]
    fn streaming_copies_every_alignment_exactly() {
        let lens = [0, 100, 4095, 4096, 4097, 4096 + 64, 30_000 + 7];
        copies_exactly(
            stream,
            (&[0, 3, 16, 63], &[0, 1, 17, 32, 63, 64]),
            &lens,
            "stream",
        );
    }

    #[test]
    fn the_adaptive_copy_keeps_the_cheaper_way_for_both_sides_and_still_tries_the_other() {
        let mut a = Adaptive::default();
        // Each way is taken until the writer and the reader both measured it.
        let mut reader = Costs::default();
        assert_eq!(a.way(reader), 0);
        a.own.0[0] = 100.0;
        assert_eq!(
            a.way(reader),
            0,
            "the reader has not measured plain bytes yet"
        );
        reader.0[0] = 50.0;
        assert_eq!(a.way(reader), 1);
        a.own.0[1] = 40.0;
        reader.0[1] = 60.0;
        // Streaming costs 100 in all, plain 150: streaming, but plain every 16th copy.
        let ways: Vec<usize> = (0..2 * EXPLORE).map(|_| a.way(reader)).collect();
        assert_eq!(ways.iter().filter(|&&w| w == 0).count(), 2, "{ways:?}");
        assert_eq!(a.favoured(reader), 1);
        // Cheap for the writer but dear for the reader: plain.
        reader.0[1] = 200.0;
        assert_eq!(a.favoured(reader), 0);
        // Smoothing: a quarter of each new measurement.
        let mut c = Costs::default();
        c.add(1, 2048, 1000);
        assert_eq!(c.0, [0.0, 500.0]);
        c.add(1, 1024, 100);
        assert_eq!(c.0, [0.0, 400.0]);
        // An outlier (a copy that lost its core) weighs as four times the estimate at most.
        c.add(1, 1024, 1_000_000);
        assert_eq!(c.0, [0.0, 700.0]);
        // And it copies.
        let src: Vec<u8> = (0..70_000u32).map(|i| i as u8).collect();
        let mut dst = vec![0u8; 70_000];
        for _ in 0..40 {
            dst.fill(0);
            a.copy(&mut dst, &src, reader);
            assert_eq!(dst, src);
        }
    }

    #[test]
    fn the_slow_band_is_one_to_thirty_one_bytes_after_modulo_four_kib() {
        let at = |d: usize| (0x1000 + d) as *const u8;
        let src = at(0);
        assert!(!aliases(at(0), src));
        assert!(aliases(at(1), src));
        assert!(aliases(at(16), src));
        assert!(aliases(at(31), src));
        assert!(!aliases(at(32), src));
        assert!(aliases(at(4096 + 8), src));
        assert!(!aliases(at(4095), src));
        assert!(!aliases(src, at(16)), "before the source is fine");
    }
}
