//! The seam through which a run's spans join a distributed trace, without the library
//! knowing of OpenTelemetry: a [`TraceContext`] given to the runner
//! ([`Runner::trace_context`](crate::Runner::trace_context)) places each attempt's
//! `partition` span in its partition's trace and names a chunk's span as a W3C
//! [`TraceParent`], which reaches the chunk's process (`TRACEPARENT`, and the
//! `traceparent` of `--exec-persistent`'s request line) and its handler
//! ([`Chunk::traceparent`]).
//!
//! The choice a reader might get wrong: **a partition's trace id is derived, not
//! generated** ([`PartitionTrace::trace_id`]): a hash of the namespace, the plan that
//! covers the pid, and the pid, mixed so that its low bytes are as evenly spread as a
//! random id's (the sampling rule below reads them). Every attempt of one partition, on any worker, before
//! or after a crash, lands in the same trace without any worker telling another; a
//! split piece keeps its partition's pid, so its spans land there too. Each attempt's
//! span is a child of a root no process exports ([`PartitionTrace::root_span_id`],
//! derived the same way): the partition as a whole, which no single worker sees begin
//! or end.
//!
//! **Head sampling is decided here, on that derived id, before any span is built**
//! ([`TraceContext::sampled`], usually [`PartitionTrace::in_sample`], OpenTelemetry's
//! `TraceIdRatioBased` rule on the id's low 8 bytes): a pure function of the trace id,
//! so every worker keeps or drops the same partitions without talking, and every
//! attempt of one partition is kept or dropped with the others. An unsampled attempt
//! costs no span at all (what it would cost is the building and encoding, not the
//! export); its chunks still get a `TRACEPARENT`, the partition's trace under its
//! unexported root with flags `-00` ([`PartitionTrace::unsampled`]), so that a chunk's
//! own OpenTelemetry SDK, whose default sampler follows its parent, records nothing
//! either, where without one it would start a sampled trace of its own per chunk.
//!
//! Without a `TraceContext` nothing here runs: no hash, no task-local, no variable.

use std::fmt;

use crate::handler::Chunk;

/// The target of the events a run records on its spans only (the waits at the gate):
/// at debug level, so that the default log filter (`tranche=info`) leaves them out of
/// the log lines, while a tracing layer that wants them asks for this target.
pub(crate) const SPAN_EVENTS: &str = "tranche::span_event";

/// A W3C trace context (`traceparent`): the trace, the span, and whether it is
/// sampled. Its [`Display`](fmt::Display) is the header's version 00 form,
/// `00-<32 hex trace id>-<16 hex span id>-<01|00>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceParent {
    trace_id: [u8; 16],
    span_id: [u8; 8],
    sampled: bool,
}

impl TraceParent {
    /// A trace context; `None` when either id is all zeros (invalid in W3C).
    pub fn new(trace_id: [u8; 16], span_id: [u8; 8], sampled: bool) -> Option<Self> {
        (trace_id != [0; 16] && span_id != [0; 8]).then_some(Self {
            trace_id,
            span_id,
            sampled,
        })
    }

    /// The trace's id.
    pub fn trace_id(&self) -> [u8; 16] {
        self.trace_id
    }

    /// The span's id.
    pub fn span_id(&self) -> [u8; 8] {
        self.span_id
    }

    /// Whether the trace is sampled (flags `01`).
    pub fn is_sampled(&self) -> bool {
        self.sampled
    }
}

impl fmt::Display for TraceParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("00-")?;
        for b in self.trace_id {
            write!(f, "{b:02x}")?;
        }
        f.write_str("-")?;
        for b in self.span_id {
            write!(f, "{b:02x}")?;
        }
        f.write_str(if self.sampled { "-01" } else { "-00" })
    }
}

/// What a [`TraceContext`] is told of an attempt's span as it starts.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PartitionTrace {
    /// The partition.
    pub pid: u64,
    /// Its attempt, from 1.
    pub attempt: u32,
    /// The first row ID of the piece, when the lease is a split piece of the partition.
    pub piece_from: Option<u64>,
    /// The partition's trace: derived from the namespace, the plan and the pid, the
    /// same on every worker and for every attempt.
    pub trace_id: [u8; 16],
    /// The partition's root, derived as the trace id is: the parent of every attempt's
    /// span, never exported itself.
    pub root_span_id: [u8; 8],
}

impl PartitionTrace {
    /// The trace of `pid` in `namespace`, under the plan `plan` covers it with (its
    /// first pid, first and last ID and partition size), if known.
    pub(crate) fn new(
        namespace: &str,
        plan: Option<[u64; 4]>,
        pid: u64,
        attempt: u32,
        piece_from: Option<u64>,
    ) -> Self {
        let mut key = Vec::with_capacity(namespace.len() + 48);
        key.extend_from_slice(namespace.as_bytes());
        // A byte no namespace holds: `a` + plan and `ab` + plan never meet.
        key.push(0xff);
        for n in plan.unwrap_or_default() {
            key.extend_from_slice(&n.to_be_bytes());
        }
        key.extend_from_slice(&pid.to_be_bytes());
        // FNV reads its input byte by byte: the root's key (the trace's and `root`)
        // goes on from the trace's state rather than from the start.
        let state = fnv1a_128(FNV_OFFSET, &key);
        let trace = mixed(state).max(1);
        let root = (mixed(fnv1a_128(state, b"root")) as u64).max(1);
        Self {
            pid,
            attempt,
            piece_from,
            trace_id: trace.to_be_bytes(),
            root_span_id: root.to_be_bytes(),
        }
    }

    /// Whether this partition's trace is kept when a `ratio` (0 to 1) of traces is:
    /// OpenTelemetry's `TraceIdRatioBased` rule (as its SDKs implement it) on the
    /// derived trace id, so the same on every worker, for every attempt. The low 8
    /// bytes of the id, big-endian, shifted right by one, are kept when below `ratio`
    /// times 2^63; a ratio of 1 or more keeps all, 0 (or NaN) none.
    pub fn in_sample(&self, ratio: f64) -> bool {
        trace_id_ratio(self.trace_id, ratio)
    }

    /// The trace context of a chunk of an attempt that is not sampled: the partition's
    /// trace and (unexported) root, flags `00`, so that whatever the chunk runs does
    /// not record either, and what it records anyway lands in the partition's trace.
    pub(crate) fn unsampled(&self) -> Option<TraceParent> {
        TraceParent::new(self.trace_id, self.root_span_id, false)
    }
}

/// OpenTelemetry's `TraceIdRatioBased` decision for `trace_id` at `ratio`
/// ([`PartitionTrace::in_sample`]).
pub(crate) fn trace_id_ratio(trace_id: [u8; 16], ratio: f64) -> bool {
    if ratio >= 1.0 {
        return true;
    }
    // `as` saturates, and NaN.max(0.0) is 0: a bound of 0 keeps nothing.
    let bound = (ratio.max(0.0) * (1u64 << 63) as f64) as u64;
    let mut low = [0; 8];
    low.copy_from_slice(&trace_id[8..]);
    (u64::from_be_bytes(low) >> 1) < bound
}

/// FNV-1a, 128 bits: stable across Rust releases and platforms (std's hasher promises
/// neither), which the fleet's workers need to agree on a trace id. Its low 64 bits are
/// barely mixed (its prime is 2^88 + 315: below bit 64 each byte is only multiplied by
/// 315), so it is never used without [`mixed`].
/// `state` is [`FNV_OFFSET`] to hash `bytes` alone, or an earlier call's result to hash
/// what it read followed by `bytes`.
fn fnv1a_128(state: u128, bytes: &[u8]) -> u128 {
    const PRIME: u128 = 0x0000_0000_0100_0000_0000_0000_0000_013b;
    bytes
        .iter()
        .fold(state, |h, &b| (h ^ u128::from(b)).wrapping_mul(PRIME))
}

/// FNV-1a's 128-bit offset basis: the state before the first byte.
const FNV_OFFSET: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;

/// Makes every bit of a hash depend on every other: MurmurHash3's 64-bit finalizer on
/// each half, the halves crossed (a bijection, so no two hashes meet). OpenTelemetry's
/// ratio rule reads a trace id's low 8 bytes as uniformly random (and W3C's level 2
/// "random" flag the low 7); unmixed, FNV's put 1,000 consecutive pids all on one
/// side of a 0.1 ratio.
fn mixed(h: u128) -> u128 {
    fn fmix64(mut k: u64) -> u64 {
        k ^= k >> 33;
        k = k.wrapping_mul(0xff51_afd7_ed55_8ccd);
        k ^= k >> 33;
        k = k.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        k ^ (k >> 33)
    }
    let (hi, lo) = ((h >> 64) as u64, h as u64);
    let lo = fmix64(lo ^ fmix64(hi));
    let hi = fmix64(hi ^ lo);
    (u128::from(hi) << 64) | u128::from(lo)
}

/// Puts a run's spans into distributed traces: implemented by the binary's OTLP
/// exporter (`tranche run --otlp-endpoint`, feature `otel`), or by a library user over
/// their own OpenTelemetry layer (`tracing-opentelemetry`'s `OpenTelemetrySpanExt`).
/// Called only for spans the subscriber enabled, except [`sampled`](Self::sampled).
pub trait TraceContext: Send + Sync + 'static {
    /// Whether `partition`'s attempt is recorded (head sampling), asked before its
    /// span is built: when not, the attempt and its chunks get no span at all, and each
    /// chunk a `TRACEPARENT` with flags `00` ([`Chunk::traceparent`]). Keep it a pure
    /// function of `partition.trace_id` ([`PartitionTrace::in_sample`]) so that every
    /// worker and every attempt of one partition agree. By default, every attempt.
    fn sampled(&self, partition: &PartitionTrace) -> bool {
        let _ = partition;
        true
    }

    /// Places an attempt's `partition` span in its partition's trace (a child of
    /// `partition.root_span_id` in `partition.trace_id`), before it is first entered;
    /// the run's span is the current one, to link to.
    fn partition(&self, span: &tracing::Span, partition: &PartitionTrace);

    /// The trace context of `span` (a `chunk` span), for the chunk's process and
    /// handler; `None` if it has none.
    fn traceparent(&self, span: &tracing::Span) -> Option<TraceParent>;
}

impl fmt::Debug for dyn TraceContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TraceContext")
    }
}

tokio::task_local! {
    /// The chunk whose handler or process runs in this task, and its trace context.
    static CURRENT: (u64, u64, u64, TraceParent);
}

/// Runs `work` (the chunk's) with its trace context readable by [`Chunk::traceparent`].
pub(crate) async fn scoped<F: std::future::Future>(
    chunk: &Chunk,
    traceparent: TraceParent,
    work: F,
) -> F::Output {
    CURRENT
        .scope((chunk.pid, chunk.index, chunk.fence, traceparent), work)
        .await
}

impl Chunk {
    /// The W3C trace context of this chunk's span (the `TRACEPARENT` a command gets),
    /// when the run exports traces ([`Runner::trace_context`](crate::Runner::trace_context),
    /// `tranche run --otlp-endpoint`): pass it on to continue the trace (an
    /// OpenTelemetry SDK's propagator, PostgreSQL's `application_name`). When the
    /// partition is not sampled ([`TraceContext::sampled`]) there is no chunk span: the
    /// context is then the partition's trace and root with flags `00`
    /// ([`TraceParent::is_sampled`] false), for the chunk not to record either. `None`
    /// without a trace context, and outside the chunk's own future (read it before
    /// spawning tasks).
    ///
    /// An accessor rather than a field: `Chunk` stays a plain value that tests build
    /// with a struct literal, and one that is `Copy`.
    pub fn traceparent(&self) -> Option<TraceParent> {
        CURRENT
            .try_with(|&(pid, index, fence, tp)| {
                (pid == self.pid && index == self.index && fence == self.fence).then_some(tp)
            })
            .ok()
            .flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_traceparent_is_w3c_version_00() {
        let tp = TraceParent::new([0xab; 16], [0x01; 8], true).unwrap();
        assert_eq!(
            tp.to_string(),
            "00-abababababababababababababababab-0101010101010101-01"
        );
        assert!(TraceParent::new([0; 16], [1; 8], true).is_none());
        assert!(TraceParent::new([1; 16], [0; 8], true).is_none());
    }

    #[test]
    fn every_attempt_of_a_partition_shares_its_trace() {
        let plan = Some([1, 1, 10_000, 1000]);
        let a = PartitionTrace::new("ns", plan, 7, 1, None);
        let b = PartitionTrace::new("ns", plan, 7, 3, Some(6500));
        assert_eq!((a.trace_id, a.root_span_id), (b.trace_id, b.root_span_id));
        for other in [
            PartitionTrace::new("ns", plan, 8, 1, None),
            PartitionTrace::new("ns2", plan, 7, 1, None),
            PartitionTrace::new("ns", Some([1, 1, 20_000, 1000]), 7, 1, None),
            PartitionTrace::new("ns", None, 7, 1, None),
        ] {
            assert_ne!(a.trace_id, other.trace_id);
        }
        // Pinned: workers of other versions must agree on it.
        let pinned = TraceParent::new(a.trace_id, a.root_span_id, true).unwrap();
        assert_eq!(
            pinned.to_string(),
            "00-3fcaf82f216e52f215fe69e856222467-d6e4d55ea32a8c1d-01"
        );
    }

    /// The `TraceIdRatioBased` rule of OpenTelemetry's Go and Rust SDKs: the id's low
    /// 8 bytes, big-endian, shifted right once, below `ratio * 2^63`. The stable spec
    /// asks for a deterministic rule under which a higher ratio keeps every trace a
    /// lower one keeps; both are checked, and the boundary pinned.
    #[test]
    fn the_ratio_rule_is_opentelemetrys_trace_id_ratio_based() {
        let id = |low: u64| {
            let mut id = [0xee; 16];
            id[8..].copy_from_slice(&low.to_be_bytes());
            id
        };
        // A half keeps exactly the low halves below 2^63, i.e. the top bit clear; the
        // high 8 bytes play no part.
        assert!(trace_id_ratio(id(0x7fff_ffff_ffff_ffff), 0.5));
        assert!(!trace_id_ratio(id(0x8000_0000_0000_0000), 0.5));
        assert!(trace_id_ratio(id(0), 0.5));
        // A quarter: below 2^61 after the shift, i.e. below 2^62 before it.
        assert!(trace_id_ratio(id((1 << 62) - 1), 0.25));
        assert!(!trace_id_ratio(id(1 << 62), 0.25));
        // 0 (and NaN, and below) keep nothing, not even the smallest id; 1 and above all.
        for keep_none in [0.0, -1.0, f64::NAN] {
            assert!(!trace_id_ratio(id(0), keep_none));
        }
        for keep_all in [1.0, 2.0] {
            assert!(trace_id_ratio(id(u64::MAX), keep_all));
        }
        // Deterministic and monotonic over the derived ids of a plan.
        let plan = Some([1, 1, 1_000_000, 1000]);
        let ratios = [0.0, 0.01, 0.1, 0.3, 0.5, 0.9, 0.999, 1.0];
        let mut kept = [0usize; 8];
        for pid in 1..=1000 {
            let t = PartitionTrace::new("ns", plan, pid, 1, None);
            let at: Vec<bool> = ratios.iter().map(|&r| t.in_sample(r)).collect();
            assert!(at.windows(2).all(|w| w[0] <= w[1]), "pid {pid}: {at:?}");
            assert_eq!(at, ratios.map(|r| t.in_sample(r)).to_vec());
            for (k, keep) in kept.iter_mut().zip(at) {
                *k += usize::from(keep);
            }
        }
        // And the derived ids spread: each ratio keeps about its share of 1000.
        for (r, k) in ratios.iter().zip(kept) {
            let expected = r * 1000.0;
            assert!((k as f64 - expected).abs() <= 45.0, "{r}: {k} kept");
        }
        // The unsampled chunk's context: the partition's trace and root, flags 00.
        let t = PartitionTrace::new("ns", plan, 7, 2, None);
        let tp = t.unsampled().unwrap();
        assert_eq!(
            (tp.trace_id(), tp.span_id(), tp.is_sampled()),
            (t.trace_id, t.root_span_id, false)
        );
        assert!(tp.to_string().ends_with("-00"));
    }

    #[tokio::test]
    async fn a_chunk_reads_its_own_context_only() {
        let chunk = Chunk {
            pid: 7,
            index: 2,
            from: 6201,
            to: 6300,
            attempt: 3,
            fence: 41,
        };
        let tp = TraceParent::new([2; 16], [3; 8], true).unwrap();
        assert_eq!(chunk.traceparent(), None);
        let seen = scoped(&chunk, tp, async {
            let other = Chunk {
                index: chunk.index + 1,
                ..chunk
            };
            (chunk.traceparent(), other.traceparent())
        })
        .await;
        assert_eq!(seen, (Some(tp), None));
    }
}
