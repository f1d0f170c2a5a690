//! The perftest-style tools behind `monel perf`, `monel pingpong` and `monel transfer`, over
//! the verbs API: what rdma-core's `ibv_rc_pingpong` and perftest's `ib_*` programs do.

pub(crate) mod perf;
pub(crate) mod perftest_oob;
pub(crate) mod perftest_runs;
pub(crate) mod pingpong;
pub(crate) mod srq_pingpong;
pub(crate) mod transfer;
