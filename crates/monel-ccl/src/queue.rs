//! Work for one communicator in issue order, for callers that issue operations
//! asynchronously (torch's `async_op`, the frameworks' futures): one job runs at a time, on
//! the worker thread or on a caller that waits for a queued job. That caller runs the jobs
//! ahead of its own, then its own, so a blocking call costs no thread hand-off.
//!
//! A job starts in one of three ways ([`Start`]): on its caller, which waits at once; on the
//! worker, now; or on the worker after [`DEFER`], unless a caller waits for it (or a later
//! job) first and runs it itself. Frameworks that issue every operation asynchronously and
//! wait for most of them at once run the common case on the caller, and a stream of such
//! jobs wakes the worker about once per `DEFER`, not once per job.
//!
//! The queue runs its jobs on any `T` (a [`crate::Communicator`] in the bindings; plain
//! values in the tests) and hands each job's value back through its [`Completion`].

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::error::CclError;

/// How long a deferred job waits for a caller before the worker starts it.
pub const DEFER: Duration = Duration::from_millis(5);

/// Who starts a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// The caller, which waits for it at once (a blocking call): no thread hop.
    Caller,
    /// The worker, now.
    Now,
    /// The worker after [`DEFER`], unless a caller waits for it first.
    Deferred,
}

/// What a finished job left: its outcome, and its value until someone takes it.
struct Slot<R> {
    outcome: Option<Result<(), CclError>>,
    value: Option<R>,
}

/// A job's completion, shared by the queue and whoever waits for the job.
pub struct Completion<R> {
    slot: Mutex<Slot<R>>,
    cv: Condvar,
}

impl<R> Completion<R> {
    fn new() -> Self {
        Self {
            slot: Mutex::new(Slot {
                outcome: None,
                value: None,
            }),
            cv: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Slot<R>> {
        self.slot.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn finish(&self, r: Result<R, CclError>) {
        let mut s = self.lock();
        match r {
            Ok(v) => {
                s.value = Some(v);
                s.outcome = Some(Ok(()));
            }
            Err(e) => s.outcome = Some(Err(e)),
        }
        drop(s);
        self.cv.notify_all();
    }

    /// Waits for the job to finish (up to `timeout`; `None`: for as long as it takes) and
    /// returns its outcome; `None` if the timeout passed first.
    pub fn wait(&self, timeout: Option<Duration>) -> Option<Result<(), CclError>> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut g = self.lock();
        loop {
            if let Some(r) = g.outcome.as_ref() {
                return Some(r.clone());
            }
            match deadline {
                None => g = self.cv.wait(g).unwrap_or_else(PoisonError::into_inner),
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return None;
                    }
                    g = self
                        .cv
                        .wait_timeout(g, left)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0;
                }
            }
        }
    }

    /// True once the job finished, successfully or not.
    pub fn is_done(&self) -> bool {
        self.lock().outcome.is_some()
    }

    /// True once the job finished without error.
    pub fn succeeded(&self) -> bool {
        matches!(self.lock().outcome, Some(Ok(())))
    }

    /// The job's value, once: `None` before it finished, after an error, or when taken.
    pub fn take(&self) -> Option<R> {
        self.lock().value.take()
    }

    /// Looks at the job's value where it lies (`None` as for [`Self::take`]).
    pub fn peek<X>(&self, f: impl FnOnce(Option<&R>) -> X) -> X {
        f(self.lock().value.as_ref())
    }
}

/// One job: what it does on the target, and its completion.
type Task<T, R> = Box<dyn FnOnce(&mut T) -> Result<R, CclError> + Send>;

struct Job<T, R> {
    task: Task<T, R>,
    done: Arc<Completion<R>>,
    /// When the worker may take it (`None`: never; the caller runs it).
    ready_at: Option<Instant>,
}

/// What the queue's lock guards.
struct QState<T, R> {
    jobs: VecDeque<Job<T, R>>,
    /// A job is running (on the worker or on a caller).
    running: bool,
    /// No more jobs: the worker ends once the queue is empty.
    closed: bool,
    /// The worker sleeps with a deadline no later than any deferred job's start, so a new
    /// deferred job need not wake it.
    worker_timed: bool,
    /// When the last deferred job was queued.
    last_deferred: Option<Instant>,
}

/// Jobs on one target, in issue order (see the module's overview).
pub struct JobQueue<T, R> {
    state: Mutex<QState<T, R>>,
    /// The worker sleeps here until there is a job it may take.
    work_cv: Condvar,
    /// Waiting callers sleep here while another thread runs a job.
    idle_cv: Condvar,
    target: Mutex<T>,
}

impl<T: Send + 'static, R: Send + 'static> JobQueue<T, R> {
    /// A queue over `target` and its worker thread (named `name`; `None` when the thread
    /// could not start: then only callers run jobs).
    pub fn start(target: T, name: String) -> (Arc<Self>, Option<JoinHandle<()>>) {
        let q = Arc::new(Self {
            state: Mutex::new(QState {
                jobs: VecDeque::new(),
                running: false,
                closed: false,
                worker_timed: false,
                last_deferred: None,
            }),
            work_cv: Condvar::new(),
            idle_cv: Condvar::new(),
            target: Mutex::new(target),
        });
        let w = q.clone();
        let thread = std::thread::Builder::new()
            .name(name)
            .spawn(move || w.work())
            .ok();
        (q, thread)
    }

    fn lock(&self) -> MutexGuard<'_, QState<T, R>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `task`, to start as `start` says; its completion, or `None` when the queue is
    /// closed (the task is dropped here, on the caller's thread).
    pub fn push(
        &self,
        task: impl FnOnce(&mut T) -> Result<R, CclError> + Send + 'static,
        start: Start,
    ) -> Option<Arc<Completion<R>>> {
        let done = Arc::new(Completion::new());
        let ready_at = match start {
            Start::Caller => None,
            Start::Now => Some(Instant::now()),
            Start::Deferred => Some(Instant::now() + DEFER),
        };
        let job = Job {
            task: Box::new(task),
            done: done.clone(),
            ready_at,
        };
        let mut st = self.lock();
        if st.closed {
            drop(st);
            drop(job);
            return None;
        }
        if start == Start::Deferred {
            st.last_deferred = ready_at;
        }
        st.jobs.push_back(job);
        let wake = match start {
            Start::Caller => false,
            Start::Now => true,
            Start::Deferred => !st.worker_timed,
        };
        if wake {
            self.work_cv.notify_one();
        }
        Some(done)
    }

    /// Waits for the job of `done`: with no timeout, runs it (and the jobs ahead of it) on
    /// this thread where no other thread took it yet; its outcome, `None` past the timeout.
    pub fn finish(
        &self,
        done: &Arc<Completion<R>>,
        timeout: Option<Duration>,
    ) -> Option<Result<(), CclError>> {
        if timeout.is_none() {
            self.run_through(done);
        }
        done.wait(timeout)
    }

    /// Runs `job`, then lets the next one go.
    fn run(&self, job: Job<T, R>) {
        let r = (job.task)(&mut self.target.lock().unwrap_or_else(PoisonError::into_inner));
        {
            let mut st = self.lock();
            st.running = false;
            if !st.jobs.is_empty() || st.closed {
                self.work_cv.notify_one();
                self.idle_cv.notify_all();
            }
        }
        job.done.finish(r);
    }

    /// Runs queued jobs on this thread, in order, up to and including the job of `done`;
    /// returns once that job has been taken (here or by another thread).
    pub fn run_through(&self, done: &Arc<Completion<R>>) {
        loop {
            let job = {
                let mut st = self.lock();
                loop {
                    if !st.jobs.iter().any(|j| Arc::ptr_eq(&j.done, done)) {
                        return;
                    }
                    if !st.running {
                        st.running = true;
                        break st.jobs.pop_front().expect("queue holds the job");
                    }
                    st = self
                        .idle_cv
                        .wait(st)
                        .unwrap_or_else(PoisonError::into_inner);
                }
            };
            let mine = Arc::ptr_eq(&job.done, done);
            self.run(job);
            if mine {
                return;
            }
        }
    }

    /// The worker thread: runs jobs as they become ready, until the queue is closed and
    /// empty.
    fn work(&self) {
        loop {
            let job = {
                let mut st = self.lock();
                loop {
                    let now = Instant::now();
                    let mut deadline = None;
                    if !st.running {
                        match st.jobs.front().map(|j| j.ready_at) {
                            Some(_) if st.closed => {
                                st.running = true;
                                break st.jobs.pop_front();
                            }
                            Some(Some(t)) if t <= now => {
                                st.running = true;
                                break st.jobs.pop_front();
                            }
                            Some(Some(t)) => deadline = Some(t),
                            // Its caller runs it (and wakes us after it if more are queued).
                            Some(None) => {}
                            None if st.closed => break None,
                            None => {}
                        }
                    }
                    // While deferred jobs keep coming, stay on a timer instead of being woken
                    // for each one: its deadline is never later than theirs.
                    if deadline.is_none() && st.last_deferred.is_some_and(|p| now < p + 4 * DEFER) {
                        deadline = Some(now + DEFER);
                    }
                    match deadline {
                        Some(d) => {
                            st.worker_timed = true;
                            st = self
                                .work_cv
                                .wait_timeout(st, d - now)
                                .unwrap_or_else(PoisonError::into_inner)
                                .0;
                            st.worker_timed = false;
                        }
                        None => {
                            st = self
                                .work_cv
                                .wait(st)
                                .unwrap_or_else(PoisonError::into_inner);
                        }
                    }
                }
            };
            match job {
                Some(j) => self.run(j),
                None => return,
            }
        }
    }

    /// Lets the worker start every deferred job up to and including the job of `done` now
    /// (someone polls for it instead of waiting).
    pub fn kick(&self, done: &Arc<Completion<R>>) {
        let mut st = self.lock();
        let now = Instant::now();
        let mut found = false;
        for j in st.jobs.iter_mut() {
            if let Some(t) = j.ready_at.as_mut() {
                *t = (*t).min(now);
            }
            if Arc::ptr_eq(&j.done, done) {
                found = true;
                break;
            }
        }
        if found {
            self.work_cv.notify_one();
        }
    }

    /// Takes no more jobs; the worker runs what is queued, then ends.
    pub fn close(&self) {
        self.lock().closed = true;
        self.work_cv.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::thread::{self, ThreadId};

    type Log = Vec<(u32, ThreadId)>;

    /// A job that logs its number and the thread it ran on, and returns its number.
    fn job(k: u32) -> impl FnOnce(&mut Log) -> Result<u32, CclError> + Send + 'static {
        move |log| {
            log.push((k, thread::current().id()));
            Ok(k)
        }
    }

    fn log_of(q: &JobQueue<Log, u32>) -> Log {
        q.target.lock().unwrap().clone()
    }

    #[test]
    fn jobs_run_in_issue_order_and_a_blocking_caller_runs_its_own_and_those_ahead() {
        let (q, worker) = JobQueue::start(Log::new(), "test-worker".into());
        let a = q.push(job(1), Start::Deferred).unwrap();
        let b = q.push(job(2), Start::Deferred).unwrap();
        let c = q.push(job(3), Start::Caller).unwrap();
        assert_eq!(q.finish(&c, None), Some(Ok(())));
        assert!(a.is_done() && b.is_done(), "the jobs ahead ran first");
        let log = log_of(&q);
        assert_eq!(log.iter().map(|e| e.0).collect::<Vec<_>>(), [1, 2, 3]);
        assert_eq!(
            log[2].1,
            thread::current().id(),
            "a caller's job runs on the caller"
        );
        assert_eq!(c.take(), Some(3));
        assert_eq!(c.take(), None, "a value is taken once");
        q.close();
        worker.unwrap().join().unwrap();
    }

    #[test]
    fn deferred_and_kicked_jobs_start_on_the_worker_when_nobody_waits() {
        let (q, worker) = JobQueue::start(Log::new(), "test-worker".into());
        let d = q.push(job(1), Start::Deferred).unwrap();
        assert_eq!(d.wait(Some(Duration::from_secs(10))), Some(Ok(())));
        let k = q.push(job(2), Start::Deferred).unwrap();
        q.kick(&k);
        assert_eq!(k.wait(Some(Duration::from_secs(10))), Some(Ok(())));
        let n = q.push(job(3), Start::Now).unwrap();
        assert_eq!(n.wait(Some(Duration::from_secs(10))), Some(Ok(())));
        let me = thread::current().id();
        assert!(
            log_of(&q).iter().all(|e| e.1 != me),
            "every job ran on the worker"
        );
        q.close();
        worker.unwrap().join().unwrap();
    }

    #[test]
    fn a_waiter_past_its_timeout_is_told_and_errors_reach_the_waiter_alone() {
        let (q, worker) = JobQueue::start(Log::new(), "test-worker".into());
        // A job the worker never takes (its caller runs it) is not done within a timeout.
        let held = q.push(job(1), Start::Caller).unwrap();
        assert_eq!(held.wait(Some(Duration::from_millis(20))), None);
        let bad = q
            .push(|_: &mut Log| Err(CclError::invalid("no")), Start::Caller)
            .unwrap();
        let after = q.push(job(3), Start::Caller).unwrap();
        assert_eq!(q.finish(&bad, None), Some(Err(CclError::invalid("no"))));
        assert!(!bad.succeeded() && bad.take().is_none());
        assert_eq!(q.finish(&after, None), Some(Ok(())));
        assert!(held.succeeded(), "the job ahead ran first");
        q.close();
        worker.unwrap().join().unwrap();
    }

    #[test]
    fn a_closed_queue_takes_nothing_and_its_worker_drains_what_was_queued_then_ends() {
        let (q, worker) = JobQueue::start(Log::new(), "test-worker".into());
        let queued = q.push(job(1), Start::Caller).unwrap();
        q.close();
        assert!(q.push(job(2), Start::Now).is_none());
        worker.unwrap().join().unwrap();
        assert!(
            queued.is_done(),
            "a closing worker runs even the callers' jobs"
        );
        assert_eq!(queued.peek(|v| v.copied()), Some(1));
        assert_eq!(log_of(&q).len(), 1);
    }
}
