//! The test hook of the Redis archive (feature `testing`).

use super::*;

impl<C> RedisArchive<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// Overwrites the sealed bytes of `batch` with `bytes`, in its own key or in its
    /// segment, keeping the TTL (tests of the corrupt-batch path; not atomic; feature
    /// `testing`). Returns whether the batch was sealed.
    #[cfg(feature = "testing")]
    pub async fn corrupt_batch(&self, batch: u64, bytes: Vec<u8>) -> Result<bool> {
        let key = self.schema.completed_batch(batch);
        let (seg, slot) = SegmentRef::of(&self.schema, batch);
        let seg_key = seg.key(&self.schema);
        let (own, joined): (bool, Option<Vec<u8>>) = retry(&self.conn, |mut c| {
            let mut pipe = redis::pipe();
            pipe.cmd("EXISTS").arg(&key).cmd("GET").arg(&seg_key);
            async move { pipe.query_async(&mut c).await }
        })
        .await?;
        let (target, value) = if own {
            (key, bytes)
        } else if let Some(old) = joined {
            let mut blobs = segment::stored_blobs(&old).map_err(|detail| Error::Corrupt {
                key: seg_key.clone(),
                detail,
            })?;
            if blobs[slot].is_empty() {
                return Ok(false);
            }
            // The segment keeps its layout: in version 2 the bytes go in headless
            // when they strip, as they are when they do not (garbage stays garbage).
            if segment::version(&old) == Some(2) {
                blobs[slot] = tranche_codec::strip_binary_v2_header(&bytes)
                    .map_or(bytes, |(_, _, headless)| headless);
                (seg_key, segment::build_v2(self.schema.batch_size(), &blobs))
            } else {
                blobs[slot] = bytes;
                (seg_key, segment::build(&blobs))
            }
        } else {
            return Ok(false);
        };
        let _: () = retry(&self.conn, |mut c| {
            let (target, value) = (&target, &value);
            async move {
                redis::cmd("SET")
                    .arg(target)
                    .arg(value)
                    .arg("KEEPTTL")
                    .query_async(&mut c)
                    .await
            }
        })
        .await?;
        Ok(true)
    }

    /// Makes the summary-tier expiry of `batch` happen now (feature `testing`): every
    /// key holding it (its sealed key, its segment) that has a TTL is expired with
    /// `PEXPIRE key 0`, so tests never race Redis's clock. Returns the PTTL, in ms,
    /// each such key had left.
    #[cfg(feature = "testing")]
    pub async fn expire_batch(&self, batch: u64) -> Result<Vec<i64>> {
        let (seg, _) = SegmentRef::of(&self.schema, batch);
        let mut left = Vec::new();
        for key in [self.schema.completed_batch(batch), seg.key(&self.schema)] {
            let mut c = self.conn.clone();
            let pttl: i64 = redis::cmd("PTTL").arg(&key).query_async(&mut c).await?;
            if pttl >= 0 {
                let _: i64 = redis::cmd("PEXPIRE")
                    .arg(&key)
                    .arg(0)
                    .query_async(&mut c)
                    .await?;
                left.push(pttl);
            }
        }
        Ok(left)
    }
}
