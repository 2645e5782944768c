//! In-order queues and events.
//!
//! A queue is a worker thread that runs the operations submitted to it in order, asynchronously
//! to the caller. A job that fails or panics (the panic is caught) **fails the queue**: the jobs
//! after it are skipped (they would read what the failed one should have written), every later
//! submit is refused, and `synchronize` returns the error, every time, without hanging, until
//! the queue is destroyed and a new one created. Event jobs still run on a failed queue, so that
//! nobody waiting for an event waits forever; the event carries the queue's error.
//!
//! A queue of a device with streams that order its work (CUDA) also takes *enqueued* jobs
//! ([`Queue::submit_enqueued`]): the job only puts its operation on the stream and hands over
//! what must stay alive until the operation has run. The worker **drains** the stream (the
//! queue's `drain`, a stream synchronize) when it has caught up with its submitters, before any
//! other job (an event's, a wait's), and after [`MAX_IN_FLIGHT`] enqueued jobs; only then are
//! their keep-alives dropped and the jobs counted as done. So the GPU runs a queue's operations
//! back to back while `synchronize`, events and the memory's lifetime still mean "has run". A
//! failure the drain reports fails the queue like a failed job. What the drained operations
//! used is then released if the failure is *settled* (the device has reported their work
//! ended or lost), and handed to the queue's [`Quarantine`] if it is not
//! ([`Error::Unsettled`]: the device may still be at it), which never frees it. Dropping a
//! keep-alive runs backend code (a free, an unload): a panic there fails the queue too, never
//! its thread.

use offload_core::{Error, Result};
use std::any::Any;
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use offload_core::sync::lock;

/// A job: gets the queue's failure, if any (only jobs submitted with `always` run then).
pub type Job = Box<dyn FnOnce(Option<&Error>) -> Result<()> + Send>;

/// What an enqueued job's operation needs alive until the stream has been drained.
pub type KeepAlive = Box<dyn Any + Send>;

/// An enqueued job: puts its operation on the stream, after pushing what the operation needs
/// alive into the list it is given (pushed first, so that it is kept even when enqueueing fails
/// part way).
pub type EnqueueJob = Box<dyn FnOnce(&mut Vec<KeepAlive>) -> Result<()> + Send>;

/// Waits until everything enqueued on a queue's stream has run (its error, if any failed).
pub type Drain = Box<dyn Fn() -> Result<()> + Send>;

/// Takes what enqueued operations used when their drain failed unsettled
/// ([`Error::Unsettled`]): it must never be dropped while the device may still touch it.
pub type Quarantine = Box<dyn Fn(Vec<KeepAlive>, &Error) + Send>;

/// At most this many enqueued jobs run ahead of a drain.
pub const MAX_IN_FLIGHT: usize = 1024;

enum Message {
    Run(Job, bool),
    Enqueue(EnqueueJob),
}

#[derive(Debug, Default)]
struct State {
    pending: u64,
    failed: Option<Error>,
}

type Shared = Arc<(Mutex<State>, Condvar)>;

/// See the module docs.
#[derive(Debug)]
pub struct Queue {
    name: String,
    sender: Mutex<Option<mpsc::Sender<Message>>>,
    state: Shared,
    worker: Mutex<Option<JoinHandle<()>>>,
}

/// The worker's enqueued jobs whose operations may still be running.
struct InFlight {
    jobs: u64,
    keep: Vec<KeepAlive>,
    drain: Option<Drain>,
    quarantine: Option<Quarantine>,
}

impl InFlight {
    /// Drains the stream, then drops the keep-alives (or, if the drain did not settle, hands
    /// them to the quarantine) and counts the jobs as done (a drain's failure fails the queue).
    fn settle(&mut self, state: &Shared, name: &str) {
        if self.jobs == 0 && self.keep.is_empty() {
            return;
        }
        let mut outcome = match &self.drain {
            // A drain that panicked says nothing of whether the work ended: unsettled.
            Some(drain) => offload_core::panic::catch(drain).unwrap_or_else(|m| {
                Err(
                    Error::PluginPanic(format!("draining the stream of {name} panicked: {m}"))
                        .unsettled(),
                )
            }),
            None => Ok(()),
        };
        let keep = std::mem::take(&mut self.keep);
        if let Err(e) = &outcome
            && e.is_unsettled()
        {
            self.keep = keep;
            return self.quarantine(state, e);
        } else if let Err(m) = offload_core::panic::catch(move || drop(keep)) {
            outcome = outcome.and(Err(Error::PluginPanic(format!(
                "releasing what the work of {name} used panicked: {m}"
            ))));
        }
        finish(state, std::mem::take(&mut self.jobs), outcome);
    }

    /// Hands what the enqueued jobs use to the quarantine (never released) and counts them
    /// as done with `why`.
    fn quarantine(&mut self, state: &Shared, why: &Error) {
        let keep = std::mem::take(&mut self.keep);
        match &self.quarantine {
            Some(q) => q(keep, why),
            None => std::mem::forget(keep),
        }
        finish(state, std::mem::take(&mut self.jobs), Err(why.clone()));
    }
}

/// The outcome of a skipped job whose closure was dropped: a panic in a drop it ran is a
/// failure.
fn skipped(dropped: std::result::Result<(), String>, name: &str) -> Result<()> {
    dropped
        .map_err(|m| Error::PluginPanic(format!("releasing a skipped job of {name} panicked: {m}")))
}

/// Counts `jobs` as done with `outcome` (the first failure is the queue's).
fn finish(state: &Shared, jobs: u64, outcome: Result<()>) {
    let mut s = lock(&state.0);
    s.pending -= jobs;
    if let Err(e) = outcome
        && s.failed.is_none()
    {
        s.failed = Some(e);
    }
    state.1.notify_all();
}

impl Queue {
    /// Starts a queue's worker thread; `name` appears in messages and as the thread's name.
    /// `drain` waits for the stream that enqueued jobs put their operations on (`None`: the
    /// queue takes no enqueued jobs that outlive their call); `quarantine` takes what they
    /// used when a drain fails unsettled (`None`: it is leaked).
    pub fn new(
        name: String,
        drain: Option<Drain>,
        quarantine: Option<Quarantine>,
    ) -> Result<Queue> {
        let (tx, rx) = mpsc::channel::<Message>();
        let state: Shared = Arc::default();
        let worker_state = state.clone();
        let thread_name = name.clone();
        let worker = std::thread::Builder::new()
            .name(thread_name.clone())
            .spawn(move || {
                let mut in_flight = InFlight {
                    jobs: 0,
                    keep: Vec::new(),
                    drain,
                    quarantine,
                };
                loop {
                    let message = if in_flight.jobs == 0 && in_flight.keep.is_empty() {
                        match rx.recv() {
                            Ok(m) => m,
                            Err(_) => break,
                        }
                    } else {
                        match rx.try_recv() {
                            Ok(m) => m,
                            Err(mpsc::TryRecvError::Empty) => {
                                // Caught up with the submitters: let the stream finish.
                                in_flight.settle(&worker_state, &thread_name);
                                continue;
                            }
                            Err(mpsc::TryRecvError::Disconnected) => {
                                in_flight.settle(&worker_state, &thread_name);
                                break;
                            }
                        }
                    };
                    match message {
                        Message::Enqueue(job) => {
                            if lock(&worker_state.0).failed.is_some() {
                                // Skipped: what it holds goes before it counts as done.
                                let dropped = offload_core::panic::catch(move || drop(job));
                                finish(&worker_state, 1, skipped(dropped, &thread_name));
                                continue;
                            }
                            let outcome = offload_core::panic::catch(|| job(&mut in_flight.keep))
                                .unwrap_or_else(|m| {
                                    Err(Error::PluginPanic(format!(
                                        "a job on {thread_name} panicked: {m}"
                                    )))
                                });
                            match outcome {
                                Ok(()) => {
                                    in_flight.jobs += 1;
                                    if in_flight.jobs >= MAX_IN_FLIGHT as u64 {
                                        in_flight.settle(&worker_state, &thread_name);
                                    }
                                }
                                Err(e) if e.is_unsettled() => {
                                    // Its own wait gave up: what it and the work before it
                                    // use may still be in use, so it is quarantined, not
                                    // drained and released.
                                    in_flight.quarantine(&worker_state, &e);
                                    finish(&worker_state, 1, Err(e));
                                }
                                Err(e) => {
                                    // What it did enqueue, and the work before it, run first;
                                    // an earlier failure (the drain's) is the queue's.
                                    in_flight.settle(&worker_state, &thread_name);
                                    finish(&worker_state, 1, Err(e));
                                }
                            }
                        }
                        Message::Run(job, always) => {
                            // The work before it has run by the time it runs.
                            in_flight.settle(&worker_state, &thread_name);
                            let failed = lock(&worker_state.0).failed.clone();
                            let outcome = if failed.is_some() && !always {
                                let dropped = offload_core::panic::catch(move || drop(job));
                                skipped(dropped, &thread_name)
                            } else {
                                offload_core::panic::catch(|| job(failed.as_ref())).unwrap_or_else(
                                    |m| {
                                        Err(Error::PluginPanic(format!(
                                            "a job on {thread_name} panicked: {m}"
                                        )))
                                    },
                                )
                            };
                            finish(&worker_state, 1, outcome);
                        }
                    }
                }
            })
            .map_err(|e| Error::System(format!("cannot start a queue thread: {e}")))?;
        Ok(Queue {
            name,
            sender: Mutex::new(Some(tx)),
            state,
            worker: Mutex::new(Some(worker)),
        })
    }

    fn failure(&self, e: &Error) -> Error {
        e.clone().context(format!(
            "{} failed earlier and accepts no more work; destroy it and create a new one",
            self.name
        ))
    }

    /// Enqueues `job` (refused once the queue has failed, unless `always`).
    pub fn submit(&self, job: Job, always: bool) -> Result<()> {
        self.send(Message::Run(job, always), always)
    }

    /// Enqueues a job that only puts its operation on the queue's stream (see the module docs):
    /// it counts as done once the stream has been drained after it.
    pub fn submit_enqueued(&self, job: EnqueueJob) -> Result<()> {
        self.send(Message::Enqueue(job), false)
    }

    fn send(&self, message: Message, always: bool) -> Result<()> {
        let sender = lock(&self.sender);
        let Some(tx) = sender.as_ref() else {
            return Err(Error::NotFound(format!("{} was destroyed", self.name)));
        };
        {
            let mut s = lock(&self.state.0);
            if let Some(e) = &s.failed
                && !always
            {
                return Err(self.failure(e));
            }
            s.pending += 1;
        }
        tx.send(message).map_err(|_| {
            lock(&self.state.0).pending -= 1;
            Error::DeviceFailure(format!("the worker of {} has stopped", self.name))
        })
    }

    /// Waits until every job submitted so far has run; the queue's failure, if it has one.
    pub fn synchronize(&self) -> Result<()> {
        let (m, cv) = &*self.state;
        let mut s = lock(m);
        while s.pending > 0 {
            s = offload_core::sync::wait(cv, s);
        }
        match &s.failed {
            Some(e) => Err(e.clone().context(format!("{} failed", self.name))),
            None => Ok(()),
        }
    }

    /// Drains the queue, stops its worker and reports its failure, if any.
    pub fn shutdown(&self) -> Result<()> {
        let outcome = self.synchronize();
        drop(lock(&self.sender).take());
        if let Some(worker) = lock(&self.worker).take() {
            let _ = worker.join();
        }
        outcome
    }
}

impl Drop for Queue {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}

#[derive(Debug, Default)]
struct EventState {
    recorded: u64,
    completed: u64,
    error: Option<Error>,
    /// When the last completed recording completed: when the queue's work before it had run.
    completed_at: Option<std::time::Instant>,
}

/// A point in a queue's work (see [`Event::record`]).
#[derive(Debug, Default)]
pub struct Event {
    state: Mutex<EventState>,
    done: Condvar,
}

impl Event {
    /// Records the event on `queue`: it completes when the work submitted before it has run
    /// (with the queue's error, if the queue has failed).
    pub fn record(self: &Arc<Self>, queue: &Queue) -> Result<()> {
        let generation = {
            let mut s = lock(&self.state);
            s.recorded += 1;
            s.recorded
        };
        let me = self.clone();
        queue.submit(
            Box::new(move |failed| {
                let mut s = lock(&me.state);
                if generation > s.completed {
                    s.completed = generation;
                    s.error = failed.cloned();
                    s.completed_at = Some(std::time::Instant::now());
                }
                drop(s);
                me.done.notify_all();
                Ok(())
            }),
            true,
        )
    }

    /// Waits until the last recording has completed; its queue's error, if it failed.
    fn wait_for(&self, generation: u64) -> Result<()> {
        let mut s = lock(&self.state);
        while s.completed < generation {
            s = offload_core::sync::wait(&self.done, s);
        }
        match &s.error {
            Some(e) => Err(e.clone().context("the work an event followed failed")),
            None => Ok(()),
        }
    }

    /// Makes `queue` wait, before its later work, for the event as last recorded.
    pub fn wait_on(self: &Arc<Self>, queue: &Queue) -> Result<()> {
        let generation = lock(&self.state).recorded;
        let me = self.clone();
        queue.submit(Box::new(move |_| me.wait_for(generation)), false)
    }

    /// Waits on the calling thread for the event as last recorded.
    pub fn synchronize(&self) -> Result<()> {
        let generation = lock(&self.state).recorded;
        self.wait_for(generation)
    }

    /// The time from `earlier`'s completion to this event's, both as last recorded: an error
    /// if either was never recorded, has not completed yet, or follows failed work, or if
    /// `earlier` completed after this one. Measured on the host clock by the queue, when the
    /// work before each event had run.
    pub fn elapsed_since(&self, earlier: &Event) -> Result<std::time::Duration> {
        let at = |e: &Event, which: &str| -> Result<std::time::Instant> {
            let s = lock(&e.state);
            if s.recorded == 0 {
                return Err(Error::InvalidArgument(format!(
                    "event timing: the {which} event was never recorded"
                )));
            }
            if s.completed < s.recorded {
                return Err(Error::InvalidArgument(format!(
                    "event timing: the {which} event has not completed (synchronize it first)"
                )));
            }
            if let Some(err) = &s.error {
                return Err(err.clone().context(format!(
                    "event timing: the work the {which} event followed failed"
                )));
            }
            s.completed_at.ok_or_else(|| {
                Error::InvalidArgument(format!("event timing: the {which} event has no time"))
            })
        };
        let (start, end) = (at(earlier, "start")?, at(self, "end")?);
        end.checked_duration_since(start).ok_or_else(|| {
            Error::InvalidArgument(
                "event timing: the start event completed after the end event".into(),
            )
        })
    }

    /// Whether the event as last recorded has completed (a never-recorded event has).
    pub fn query(&self) -> bool {
        let s = lock(&self.state);
        s.completed >= s.recorded
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[test]
    fn a_failure_or_panic_fails_the_queue_for_good() {
        for bad in [
            Box::new(|_: Option<&Error>| Err(Error::DeviceFailure("boom".into()))) as Job,
            Box::new(|_: Option<&Error>| -> Result<()> { panic!("kaboom") }) as Job,
        ] {
            let q = Queue::new("queue t".into(), None, None).unwrap();
            let ran = Arc::new(AtomicU32::new(0));
            let r = ran.clone();
            q.submit(
                Box::new(move |_| {
                    r.fetch_add(1, Ordering::SeqCst);
                    Ok(())
                }),
                false,
            )
            .unwrap();
            q.submit(bad, false).unwrap();
            let r = ran.clone();
            // Accepted (the failure is not known yet) but skipped.
            let _ = q.submit(
                Box::new(move |_| {
                    r.fetch_add(10, Ordering::SeqCst);
                    Ok(())
                }),
                false,
            );
            let e = q.synchronize().unwrap_err().to_string();
            assert!(e.contains("boom") || e.contains("kaboom"), "{e}");
            assert_eq!(ran.load(Ordering::SeqCst), 1);
            // Sticky: synchronize keeps reporting it, and new work is refused.
            assert!(q.synchronize().is_err());
            let e = q
                .submit(Box::new(|_| Ok(())), false)
                .unwrap_err()
                .to_string();
            assert!(e.contains("destroy it and create a new one"), "{e}");
            // An event recorded on the failed queue completes with the error: no hang.
            let ev = Arc::new(Event::default());
            ev.record(&q).unwrap();
            assert!(ev.synchronize().is_err());
            assert!(q.shutdown().is_err());
        }
    }

    /// A stream as the drain sees it: operations "run" when drained.
    #[derive(Default)]
    struct FakeStream {
        enqueued: Mutex<Vec<u32>>,
        ran: Mutex<Vec<u32>>,
        fail_next_drain: std::sync::atomic::AtomicBool,
        unsettle_next_drain: std::sync::atomic::AtomicBool,
    }

    /// Records when it is dropped: after the drain that ran its operation, or not.
    struct Keep(Arc<FakeStream>, u32, Arc<Mutex<Vec<(u32, bool)>>>);

    impl Drop for Keep {
        fn drop(&mut self) {
            let ran = self.0.ran.lock().unwrap().contains(&self.1);
            self.2.lock().unwrap().push((self.1, ran));
        }
    }

    fn streamed_queue(stream: &Arc<FakeStream>) -> Queue {
        streamed_queue_quarantining(stream, &Arc::default())
    }

    /// A queue whose unsettled drains hand what they held to `quarantined`.
    fn streamed_queue_quarantining(
        stream: &Arc<FakeStream>,
        quarantined: &Arc<Mutex<Vec<KeepAlive>>>,
    ) -> Queue {
        let s = stream.clone();
        let quarantined = quarantined.clone();
        Queue::new(
            "queue s".into(),
            Some(Box::new(move || {
                if s.unsettle_next_drain.swap(false, Ordering::SeqCst) {
                    // The wait gave up: the operations may still be running, not "ran".
                    return Err(Error::Unsettled("the wait gave up".into()));
                }
                let mut ops = std::mem::take(&mut *s.enqueued.lock().unwrap());
                s.ran.lock().unwrap().append(&mut ops);
                if s.fail_next_drain.swap(false, Ordering::SeqCst) {
                    return Err(Error::DeviceFailure("the stream faulted".into()));
                }
                Ok(())
            })),
            Some(Box::new(move |keep, e| {
                assert!(e.is_unsettled());
                quarantined.lock().unwrap().extend(keep);
            })),
        )
        .unwrap()
    }

    fn enqueue(
        q: &Queue,
        stream: &Arc<FakeStream>,
        op: u32,
        dropped: &Arc<Mutex<Vec<(u32, bool)>>>,
    ) {
        let (s, d) = (stream.clone(), dropped.clone());
        q.submit_enqueued(Box::new(move |keep| {
            keep.push(Box::new(Keep(s.clone(), op, d)));
            s.enqueued.lock().unwrap().push(op);
            Ok(())
        }))
        .unwrap();
    }

    #[test]
    fn enqueued_work_is_kept_alive_and_counted_until_the_stream_is_drained() {
        let stream = Arc::new(FakeStream::default());
        let dropped = Arc::new(Mutex::new(Vec::new()));
        let q = streamed_queue(&stream);
        let n = MAX_IN_FLIGHT as u32 * 2 + 10;
        for op in 0..n {
            enqueue(&q, &stream, op, &dropped);
        }
        // An event completes only once the work before it has run.
        let ev = Arc::new(Event::default());
        ev.record(&q).unwrap();
        let s = stream.clone();
        let seen = Arc::new(AtomicU32::new(0));
        let seen2 = seen.clone();
        ev.synchronize().unwrap();
        assert_eq!(stream.ran.lock().unwrap().len(), n as usize);
        q.submit(
            Box::new(move |_| {
                seen2.store(s.ran.lock().unwrap().len() as u32, Ordering::SeqCst);
                Ok(())
            }),
            false,
        )
        .unwrap();
        q.synchronize().unwrap();
        assert_eq!(seen.load(Ordering::SeqCst), n);
        let d = dropped.lock().unwrap();
        assert_eq!(d.len(), n as usize);
        assert!(
            d.iter().all(|(_, ran)| *ran),
            "a keep-alive went before its operation ran"
        );
        assert_eq!(*stream.ran.lock().unwrap(), (0..n).collect::<Vec<_>>());
    }

    #[test]
    fn a_failed_drain_or_enqueue_fails_the_queue_after_keeping_what_was_enqueued() {
        let stream = Arc::new(FakeStream::default());
        let dropped = Arc::new(Mutex::new(Vec::new()));
        let q = streamed_queue(&stream);
        stream.fail_next_drain.store(true, Ordering::SeqCst);
        enqueue(&q, &stream, 1, &dropped);
        let e = q.synchronize().unwrap_err().to_string();
        assert!(e.contains("the stream faulted"), "{e}");
        assert!(q.submit_enqueued(Box::new(|_| Ok(()))).is_err());
        assert_eq!(*dropped.lock().unwrap(), vec![(1, true)]);

        // An enqueue that fails part way: what it pushed is kept until a drain.
        let q = streamed_queue(&stream);
        let (s, d) = (stream.clone(), dropped.clone());
        q.submit_enqueued(Box::new(move |keep| {
            keep.push(Box::new(Keep(s.clone(), 2, d)));
            s.enqueued.lock().unwrap().push(2);
            Err(Error::InvalidArgument("the second half".into()))
        }))
        .unwrap();
        let e = q.synchronize().unwrap_err().to_string();
        assert!(e.contains("the second half"), "{e}");
        assert_eq!(dropped.lock().unwrap().last(), Some(&(2, true)));
        // A panicking enqueue fails the queue too.
        let q = streamed_queue(&stream);
        q.submit_enqueued(Box::new(|_| panic!("kaboom"))).unwrap();
        assert!(q.synchronize().unwrap_err().to_string().contains("kaboom"));
    }

    #[test]
    fn an_unsettled_drain_quarantines_what_the_work_used_and_never_drops_it() {
        let stream = Arc::new(FakeStream::default());
        let dropped = Arc::new(Mutex::new(Vec::new()));
        let quarantined = Arc::new(Mutex::new(Vec::new()));
        let q = streamed_queue_quarantining(&stream, &quarantined);
        enqueue(&q, &stream, 1, &dropped);
        enqueue(&q, &stream, 2, &dropped);
        q.synchronize().unwrap();
        assert_eq!(*dropped.lock().unwrap(), vec![(1, true), (2, true)]);
        // A drain that gives up before the work ended: what op 3 uses goes to the quarantine,
        // not to a drop, and the queue is failed for good.
        stream.unsettle_next_drain.store(true, Ordering::SeqCst);
        enqueue(&q, &stream, 3, &dropped);
        let e = q.synchronize().unwrap_err();
        assert!(e.is_unsettled(), "{e:?}");
        assert_eq!(dropped.lock().unwrap().len(), 2, "released while unsettled");
        assert_eq!(quarantined.lock().unwrap().len(), 1);
        assert!(q.submit_enqueued(Box::new(|_| Ok(()))).is_err());
        drop(q);
        assert_eq!(
            dropped.lock().unwrap().len(),
            2,
            "released when the queue went"
        );
        // A settled failure (the drain reports the work lost) releases as before.
        stream.fail_next_drain.store(true, Ordering::SeqCst);
        let q = streamed_queue_quarantining(&stream, &quarantined);
        enqueue(&q, &stream, 5, &dropped);
        assert!(!q.synchronize().unwrap_err().is_unsettled());
        assert_eq!(dropped.lock().unwrap().last(), Some(&(5, true)));
        assert_eq!(quarantined.lock().unwrap().len(), 1);
        // The quarantine's items are never dropped, even after the test.
        std::mem::forget(std::mem::take(&mut *quarantined.lock().unwrap()));
    }

    #[test]
    fn synchronize_returns_only_after_the_drain_and_at_most_max_in_flight_run_ahead() {
        // The drain is slow and records how many operations it found waiting: `synchronize`
        // must see every one run, and no drain may find more than MAX_IN_FLIGHT.
        let stream = Arc::new(FakeStream::default());
        let most = Arc::new(AtomicU32::new(0));
        let (s, m) = (stream.clone(), most.clone());
        let q = Queue::new(
            "queue m".into(),
            Some(Box::new(move || {
                std::thread::sleep(std::time::Duration::from_millis(20));
                let mut ops = std::mem::take(&mut *s.enqueued.lock().unwrap());
                m.fetch_max(ops.len() as u32, Ordering::SeqCst);
                s.ran.lock().unwrap().append(&mut ops);
                Ok(())
            })),
            None,
        )
        .unwrap();
        // The first job waits until every other one is submitted, so the worker never finds
        // the channel empty on the way: only MAX_IN_FLIGHT makes it drain.
        let go = Arc::new((Mutex::new(false), Condvar::new()));
        let g = go.clone();
        q.submit_enqueued(Box::new(move |_| {
            let mut ready = g.0.lock().unwrap();
            while !*ready {
                ready = g.1.wait(ready).unwrap();
            }
            Ok(())
        }))
        .unwrap();
        let dropped = Arc::new(Mutex::new(Vec::new()));
        let n = MAX_IN_FLIGHT as u32 * 3;
        for op in 0..n {
            enqueue(&q, &stream, op, &dropped);
        }
        *go.0.lock().unwrap() = true;
        go.1.notify_all();
        q.synchronize().unwrap();
        assert_eq!(
            stream.ran.lock().unwrap().len(),
            n as usize,
            "synchronize returned early"
        );
        assert_eq!(dropped.lock().unwrap().len(), n as usize);
        let most = most.load(Ordering::SeqCst);
        assert!(
            most as usize <= MAX_IN_FLIGHT,
            "a drain found {most} operations in flight"
        );
    }

    #[test]
    fn a_panic_releasing_a_keep_alive_fails_the_queue_and_never_hangs_it() {
        struct Bomb;
        impl Drop for Bomb {
            fn drop(&mut self) {
                panic!("the free hook panicked");
            }
        }
        let stream = Arc::new(FakeStream::default());
        let q = streamed_queue(&stream);
        q.submit_enqueued(Box::new(|keep| {
            keep.push(Box::new(Bomb));
            Ok(())
        }))
        .unwrap();
        let e = q.synchronize().unwrap_err().to_string();
        assert!(e.contains("the free hook panicked"), "{e}");
        // A job skipped on the failed queue that panics as it is dropped: no hang either.
        let _ = q.submit(Box::new(|_| Ok(())), false);
        assert!(q.shutdown().is_err());
    }

    #[test]
    fn events_order_work_across_queues() {
        let (a, b) = (
            Queue::new("a".into(), None, None).unwrap(),
            Queue::new("b".into(), None, None).unwrap(),
        );
        let log = Arc::new(Mutex::new(Vec::new()));
        let ev = Arc::new(Event::default());
        assert!(ev.query(), "never recorded: complete");
        let l = log.clone();
        a.submit(
            Box::new(move |_| {
                std::thread::sleep(std::time::Duration::from_millis(50));
                l.lock().unwrap().push("a");
                Ok(())
            }),
            false,
        )
        .unwrap();
        ev.record(&a).unwrap();
        ev.wait_on(&b).unwrap();
        let l = log.clone();
        b.submit(
            Box::new(move |_| {
                l.lock().unwrap().push("b");
                Ok(())
            }),
            false,
        )
        .unwrap();
        b.synchronize().unwrap();
        assert_eq!(*log.lock().unwrap(), vec!["a", "b"]);
        ev.synchronize().unwrap();
        assert!(ev.query());
    }
}
