//! Production control against a real Redis and embedded.
