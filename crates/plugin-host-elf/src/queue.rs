//! In-order queues: one worker thread per queue runs enqueued copies and launches in
//! submission order, asynchronously to the caller. After a failure the rest of the queue's
//! work is skipped (it would read what the failed step should have written) until
//! `synchronize` reports the failure.

use offload_core::{Error, Result};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

type Job = Box<dyn FnOnce() -> Result<()> + Send>;

#[derive(Debug, Default)]
struct State {
    pending: u64,
    error: Option<Error>,
}

#[derive(Debug)]
pub struct Queue {
    sender: Mutex<Option<mpsc::Sender<Job>>>,
    state: Arc<(Mutex<State>, Condvar)>,
    worker: Mutex<Option<JoinHandle<()>>>,
}

impl Queue {
    pub fn new(name: String) -> Result<Queue> {
        let (tx, rx) = mpsc::channel::<Job>();
        let state: Arc<(Mutex<State>, Condvar)> = Arc::default();
        let worker_state = state.clone();
        let worker = std::thread::Builder::new()
            .name(name)
            .spawn(move || {
                for job in rx {
                    let failed = lock(&worker_state.0).error.is_some();
                    let outcome = if failed { Ok(()) } else { job() };
                    let mut s = lock(&worker_state.0);
                    s.pending -= 1;
                    if let Err(e) = outcome {
                        s.error.get_or_insert(e);
                    }
                    worker_state.1.notify_all();
                }
            })
            .map_err(|e| Error::System(format!("cannot start a queue thread: {e}")))?;
        Ok(Queue {
            sender: Mutex::new(Some(tx)),
            state,
            worker: Mutex::new(Some(worker)),
        })
    }

    pub fn submit(&self, job: Job) -> Result<()> {
        let sender = lock(&self.sender);
        let Some(tx) = sender.as_ref() else {
            return Err(Error::NotFound("queue was destroyed".into()));
        };
        lock(&self.state.0).pending += 1;
        tx.send(job).map_err(|_| {
            lock(&self.state.0).pending -= 1;
            Error::DeviceFailure("queue worker has stopped".into())
        })
    }

    pub fn synchronize(&self) -> Result<()> {
        let (m, cv) = &*self.state;
        let mut s = lock(m);
        while s.pending > 0 {
            s = cv.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        match s.error.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Drains the queue, stops its worker and reports any pending failure.
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

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[test]
    fn runs_in_order_and_skips_after_a_failure() {
        let q = Queue::new("t".into()).unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        for i in 0..50 {
            let log = log.clone();
            q.submit(Box::new(move || {
                log.lock().unwrap().push(i);
                Ok(())
            }))
            .unwrap();
        }
        q.synchronize().unwrap();
        assert_eq!(*log.lock().unwrap(), (0..50).collect::<Vec<_>>());

        let ran = Arc::new(AtomicU32::new(0));
        q.submit(Box::new(|| Err(Error::DeviceFailure("boom".into()))))
            .unwrap();
        let r = ran.clone();
        q.submit(Box::new(move || {
            r.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }))
        .unwrap();
        assert!(q.synchronize().unwrap_err().to_string().contains("boom"));
        assert_eq!(ran.load(Ordering::SeqCst), 0);
        // The error is reported once; the queue is usable again.
        q.synchronize().unwrap();
        q.shutdown().unwrap();
        assert!(q.submit(Box::new(|| Ok(()))).is_err());
    }
}
