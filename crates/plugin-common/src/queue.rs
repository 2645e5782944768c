//! In-order queues and events.
//!
//! A queue is a worker thread that runs the operations submitted to it in order, asynchronously
//! to the caller. A job that fails or panics (the panic is caught) **fails the queue**: the jobs
//! after it are skipped (they would read what the failed one should have written), every later
//! submit is refused, and `synchronize` returns the error, every time, without hanging, until
//! the queue is destroyed and a new one created. Event jobs still run on a failed queue, so that
//! nobody waiting for an event waits forever; the event carries the queue's error.

use offload_core::{Error, Result};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use offload_core::sync::lock;

/// A job: gets the queue's failure, if any (only jobs submitted with `always` run then).
pub type Job = Box<dyn FnOnce(Option<&Error>) -> Result<()> + Send>;

#[derive(Debug, Default)]
struct State {
    pending: u64,
    failed: Option<Error>,
}

/// See the module docs.
#[derive(Debug)]
pub struct Queue {
    name: String,
    sender: Mutex<Option<mpsc::Sender<(Job, bool)>>>,
    state: Arc<(Mutex<State>, Condvar)>,
    worker: Mutex<Option<JoinHandle<()>>>,
}

impl Queue {
    /// Starts a queue's worker thread; `name` appears in messages and as the thread's name.
    pub fn new(name: String) -> Result<Queue> {
        let (tx, rx) = mpsc::channel::<(Job, bool)>();
        let state: Arc<(Mutex<State>, Condvar)> = Arc::default();
        let worker_state = state.clone();
        let thread_name = name.clone();
        let worker = std::thread::Builder::new()
            .name(thread_name.clone())
            .spawn(move || {
                for (job, always) in rx {
                    let failed = lock(&worker_state.0).failed.clone();
                    let outcome = if failed.is_some() && !always {
                        Ok(())
                    } else {
                        offload_core::panic::catch(|| job(failed.as_ref())).unwrap_or_else(|m| {
                            Err(Error::PluginPanic(format!(
                                "a job on {thread_name} panicked: {m}"
                            )))
                        })
                    };
                    let mut s = lock(&worker_state.0);
                    s.pending -= 1;
                    if let Err(e) = outcome
                        && s.failed.is_none()
                    {
                        s.failed = Some(e);
                    }
                    worker_state.1.notify_all();
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
        tx.send((job, always)).map_err(|_| {
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
            let q = Queue::new("queue t".into()).unwrap();
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

    #[test]
    fn events_order_work_across_queues() {
        let (a, b) = (
            Queue::new("a".into()).unwrap(),
            Queue::new("b".into()).unwrap(),
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
