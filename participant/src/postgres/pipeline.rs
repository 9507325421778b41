//! Statements sent together on one session. tokio-postgres writes a query's messages when its
//! future is first polled and reads the answers in order, so futures polled together share one
//! round trip: PostgreSQL runs them one after another, each answered on its own.
//!
//! Only single-message calls pipeline in the order given (`execute_typed`, `query_typed`,
//! `batch_execute`, or a `Statement` prepared earlier): a query given as a `&str` to `execute`
//! or `query` first prepares it, a round trip of its own, and sends its execution after
//! whatever was sent meanwhile.

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;

/// Runs `futures` together, first polled in order (so their messages go out in that order);
/// their outputs, in the same order, once all are done.
pub(crate) async fn all<F: Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut futures: Vec<Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (future, output) in futures.iter_mut().zip(outputs.iter_mut()) {
            if output.is_none() {
                match future.as_mut().poll(cx) {
                    Poll::Ready(value) => *output = Some(value),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    outputs.into_iter().flatten().collect()
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::all;

    #[tokio::test]
    async fn futures_start_in_order_and_answer_in_order() {
        let started = Arc::new(Mutex::new(Vec::new()));
        let futures: Vec<_> = (0..5u64)
            .map(|n| {
                let started = started.clone();
                async move {
                    started.lock().unwrap().push(n);
                    // The later ones finish first.
                    tokio::time::sleep(std::time::Duration::from_millis(5 * (5 - n))).await;
                    n * 10
                }
            })
            .collect();
        assert_eq!(all(futures).await, vec![0, 10, 20, 30, 40]);
        assert_eq!(*started.lock().unwrap(), vec![0, 1, 2, 3, 4]);
    }

    #[tokio::test]
    async fn nothing_to_run_is_nothing_returned() {
        let none: Vec<std::future::Ready<u8>> = Vec::new();
        assert!(all(none).await.is_empty());
    }
}
