//! Waiting on a watched value: the one helper every floor's tasks share to wait for a
//! stop or a done signal.

use tokio::sync::watch;

/// Waits until the watched value satisfies `f` (or its sender is gone), holding no
/// borrow of it across the wait's end, so the future stays `Send`.
pub(crate) async fn until<T>(rx: &mut watch::Receiver<T>, f: impl FnMut(&T) -> bool) {
    let _ = rx.wait_for(f).await;
}
