//! Every limit of the contract, each with the reason it exists. Enforced by the side that
//! receives the data, documented in `docs/api.md`.

/// Largest HTTP request body either service accepts. Bounds memory per request; a body over it
/// is 413 `body_too_large` before any parsing.
pub const BODY_BYTES_MAX: usize = 1024 * 1024;

/// Most items in one batched phase message (`crate::batch`): bounds the work and the answer
/// one request can hold, and how long its last line may wait behind the others.
pub const BATCH_ITEMS_MAX: usize = 256;
/// Largest body of a batched phase message. A sender splits a batch before it grows past this;
/// a receiver refuses a larger body (413 `body_too_large`) before parsing it.
pub const BATCH_BODY_BYTES_MAX: usize = 8 * 1024 * 1024;
/// Largest serialized payload for one participant. Payloads are logged by the participant
/// (and digested by the coordinator), so they must fit comfortably in one WAL record.
pub const PAYLOAD_BYTES_MAX: usize = 64 * 1024;

/// Most participants in one transaction. Each one is a parallel prepare and a retried phase two;
/// more than this is almost always a client bug, and it bounds the size of a decision record.
pub const PARTICIPANTS_MAX: usize = 16;

/// Longest transaction id, in bytes. Ids appear in URLs, log lines and WAL records.
pub const TXID_LEN_MAX: usize = 128;

/// Longest participant or coordinator name, in bytes.
pub const NAME_LEN_MAX: usize = 64;

/// Longest global transaction id: a coordinator id, a 16-digit incarnation and a position of
/// at most 20 digits, joined by two ':'. Fits PostgreSQL's 200-byte gid limit.
pub const GTID_LEN_MAX: usize = NAME_LEN_MAX + 1 + 16 + 1 + 20;

/// Longest `reason` a participant may give with a no vote; longer reasons are cut to this.
pub const REASON_LEN_MAX: usize = 512;

/// Smallest prepare-phase timeout a client may ask for, in milliseconds.
pub const TIMEOUT_MS_MIN: u64 = 1;

/// Largest prepare-phase timeout a client may ask for: participants hold locks while prepared,
/// so a client must not be able to pin them for hours.
pub const TIMEOUT_MS_MAX: u64 = 5 * 60 * 1000;

/// Most transactions one listing returns.
pub const LIST_LIMIT_MAX: usize = 1000;
