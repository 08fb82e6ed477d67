//! The namespace's archive format version (`{ns}:meta` `archive_format`): read on every
//! sweep and before the first join, raised only by [`RedisArchive::raise_format`].

use super::*;
use crate::model::ArchiveFormat;

/// The field of `{ns}:meta` that holds the namespace's archive format version.
const FIELD: &str = "archive_format";

impl<C> RedisArchive<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// The namespace's archive format version as recorded now (absent: [`ArchiveFormat::V1`];
    /// a value that is no version reads as `V1` too, which every reader reads), kept for
    /// the writes that follow.
    pub async fn format(&self) -> Result<ArchiveFormat> {
        let key = &self.meta_key;
        let recorded: Option<String> = retry(&self.conn, |mut c| async move {
            redis::cmd("HGET")
                .arg(key)
                .arg(FIELD)
                .query_async(&mut c)
                .await
        })
        .await?;
        let format = match recorded.as_deref().map(str::parse::<u64>) {
            None => ArchiveFormat::V1,
            Some(Ok(n)) => ArchiveFormat::from_number(n).unwrap_or_default(),
            Some(Err(_)) => {
                tracing::warn!(key = %key, value = ?recorded, "archive_format is not a version; writing format 1");
                ArchiveFormat::V1
            }
        };
        self.format.store(format.number(), Ordering::Relaxed);
        Ok(format)
    }

    /// Raises the namespace's archive format version to `to` (`format.lua`; a higher
    /// version recorded stays), and returns the one recorded after. Writers of this
    /// version follow it from their next sweep; segments written before keep their
    /// layout, and every reader of this version reads both. Raise it for a new
    /// namespace, or once no older binary reads the namespace.
    pub async fn raise_format(&self, to: ArchiveFormat) -> Result<ArchiveFormat> {
        let key = &self.meta_key;
        let recorded: u64 = retry(&self.conn, |mut c| async move {
            FORMAT.key(key).arg(to.number()).invoke_async(&mut c).await
        })
        .await?;
        let format = ArchiveFormat::from_number(recorded).unwrap_or_default();
        self.format.store(format.number(), Ordering::Relaxed);
        Ok(format)
    }

    /// The format writes follow: as last read, or read now if never.
    pub(super) async fn write_format(&self) -> Result<ArchiveFormat> {
        match ArchiveFormat::from_number(u64::from(self.format.load(Ordering::Relaxed))) {
            Some(format) => Ok(format),
            None => self.format().await,
        }
    }
}

impl<C> RedisArchive<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// How batches are sealed under the namespace's format: from format 2, with the
    /// workers column as ranks where that is smaller (codec's flag bit 2).
    pub(super) async fn batch_options(&self) -> Result<BinaryV2Options> {
        let options = BinaryV2Options::new(self.schema.batch_size())?;
        Ok(if self.write_format().await? >= ArchiveFormat::V2 {
            options.with_ranks()
        } else {
            options
        })
    }
}
