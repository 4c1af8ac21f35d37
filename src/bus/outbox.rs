//! The service loop's way onto the bus: objects added and removed, signals,
//! and the replies that must follow them, sent in order by one task.
//!
//! The loop hands a job over and goes on. Sending can wait a long time: the
//! connection writes one message at a time, so a signal queues behind a
//! 10 MB GetManagedObjects reply that the bus daemon reads slowly. Awaited
//! on the loop, that stalled every caller and the watchdog. Here only this
//! task waits. Objects are registered silently, ahead of the reply that
//! needs them; their InterfacesAdded follows the reply.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

type Job = Pin<Box<dyn Future<Output = ()> + Send>>;

#[derive(Clone)]
pub struct Outbox {
    tx: mpsc::UnboundedSender<Job>,
}

impl Outbox {
    /// Starts the task that sends the jobs, one after another.
    pub fn start() -> Outbox {
        let (tx, mut rx) = mpsc::unbounded_channel::<Job>();
        tokio::spawn(async move {
            while let Some(job) = rx.recv().await {
                job.await;
            }
        });
        Outbox { tx }
    }

    /// Queues a job behind every job queued before it.
    pub fn send(&self, job: impl Future<Output = ()> + Send + 'static) {
        // The task ends only with the runtime: then nothing is sent anyway.
        let _ = self.tx.send(Box::pin(job));
    }

    /// Waits (at most `limit`) until what is queued now has been sent: at
    /// shutdown, so that the last replies and signals go out.
    pub async fn flush(&self, limit: Duration) -> bool {
        let (done, sent) = oneshot::channel();
        self.send(async move {
            let _ = done.send(());
        });
        matches!(tokio::time::timeout(limit, sent).await, Ok(Ok(())))
    }
}
