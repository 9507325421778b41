//! The request digest that backs idempotency: the same id with the same body is a retry, the
//! same id with another body is a conflict. It lives in `protocol::digest` (participants digest
//! payloads with the same stable hash); this re-export keeps the coordinator's name for it.

pub use protocol::digest::Digest;
