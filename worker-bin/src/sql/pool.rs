//! The handler's connections: at most `size` open at once, each with the statement
//! prepared on it once, opened as chunks need them and dropped when they break.
//!
//! A connection goes back to the pool only when its chunk's transaction ended
//! cleanly ([`Lease::release`]). One dropped half way (an error, or the run dropping
//! the chunk's future at the end of its grace) is closed instead: the server then
//! rolls back whatever it held, and the next chunk gets a fresh one.

use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;
use tokio_postgres::types::Type;
use tokio_postgres::{Client, Config, Statement};

use super::tls::Tls;

/// One open connection and the statement prepared on it.
pub(super) struct Conn {
    pub(super) client: Client,
    pub(super) statement: Statement,
    /// The task that drives the socket: owned here, stopped with the connection.
    driver: JoinHandle<()>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

/// How to open a connection, and which statement to prepare on it.
pub(super) struct Opener {
    pub(super) config: Config,
    pub(super) tls: Tls,
    /// The session's settings (the chunk's timeouts), sent once as it opens.
    pub(super) session: String,
    pub(super) statement: String,
    pub(super) types: Vec<Type>,
}

impl Opener {
    /// Connects, sets the session up and prepares the statement (the two pipelined).
    pub(super) async fn open(&self) -> Result<Conn, tokio_postgres::Error> {
        let (client, driver) = self.tls.connect(&self.config).await?;
        // If either fails, `client` is dropped and its connection closes with it.
        let ((), statement) = futures_util::future::try_join(
            client.batch_execute(&self.session),
            client.prepare_typed(&self.statement, &self.types),
        )
        .await?;
        Ok(Conn {
            statement,
            client,
            driver,
        })
    }
}

/// The pool: `permits` caps the connections in use, `idle` holds the open ones no
/// chunk uses.
pub(super) struct Pool {
    opener: Opener,
    permits: Arc<Semaphore>,
    idle: Mutex<Vec<Conn>>,
}

impl Pool {
    /// A pool of at most `size` connections, holding `first` already.
    pub(super) fn new(opener: Opener, size: usize, first: Conn) -> Self {
        Self {
            opener,
            permits: Arc::new(Semaphore::new(size)),
            idle: Mutex::new(vec![first]),
        }
    }

    /// A connection for one chunk, waiting while all are in use: an idle one that is
    /// still open, else a new one.
    pub(super) async fn get(&self) -> Result<Lease<'_>, tokio_postgres::Error> {
        let permit = self
            .permits
            .clone()
            .acquire_owned()
            .await
            .expect("the pool's semaphore is never closed");
        let idle = loop {
            let Some(conn) = self.idle.lock().expect("pool lock").pop() else {
                break None;
            };
            if !conn.client.is_closed() {
                break Some(conn);
            }
        };
        let conn = match idle {
            Some(conn) => conn,
            None => self.opener.open().await?,
        };
        Ok(Lease {
            pool: self,
            conn: Some(conn),
            _permit: permit,
        })
    }
}

/// A connection in use by one chunk.
pub(super) struct Lease<'a> {
    pool: &'a Pool,
    /// Always `Some` until released.
    conn: Option<Conn>,
    _permit: OwnedSemaphorePermit,
}

impl Lease<'_> {
    pub(super) fn conn(&self) -> &Conn {
        self.conn.as_ref().expect("a lease holds its connection")
    }

    /// Gives the connection back for the next chunk: only after a transaction that
    /// ended (committed or rolled back), never one left open.
    pub(super) fn release(mut self) {
        if let Some(conn) = self.conn.take() {
            self.pool.idle.lock().expect("pool lock").push(conn);
        }
    }
}
