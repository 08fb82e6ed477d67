//! Helpers shared by the integration tests.

#![allow(dead_code, unreachable_pub)]

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, Wake, Waker};

/// A waker that counts how often it was woken, to assert when a future is woken
/// without depending on timing.
#[derive(Default)]
pub struct Wakes(AtomicUsize);

impl Wake for Wakes {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// A future polled by hand with a counting waker.
pub struct Polled<F: Future> {
    future: Pin<Box<F>>,
    wakes: Arc<Wakes>,
}

impl<F: Future> Polled<F> {
    pub fn new(future: F) -> Self {
        Polled {
            future: Box::pin(future),
            wakes: Arc::default(),
        }
    }

    /// Polls once; `None` while pending.
    pub fn poll(&mut self) -> Option<F::Output> {
        let waker = Waker::from(self.wakes.clone());
        match self.future.as_mut().poll(&mut Context::from_waker(&waker)) {
            Poll::Ready(out) => Some(out),
            Poll::Pending => None,
        }
    }

    /// How often the future's waker has been woken so far.
    pub fn wakes(&self) -> usize {
        self.wakes.0.load(Ordering::SeqCst)
    }
}
