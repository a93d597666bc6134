//! `itcp-handoff`: moving live TCP connections between MSRs.
//!
//! **Socket images** ([`image`]): capture a connected TCP socket's complete state with
//! TCP_REPAIR, carry it as a versioned, serde-serializable image (or a compact binary
//! encoding), restore it on another host without the peer's cooperation, restart it,
//! and delete the original without FIN or RST. See docs/architecture.md §4 and the
//! [`image`] module documentation for the restore order and the sequence-number rules.
//!
//! On these images build the MSR⇄MSR handoff as sans-IO state machines ([`machine`],
//! [`greet`]) and the handoff log records ([`log`]).
//!
//! Raw syscalls live in [`repair`] (safe wrappers with `// SAFETY:` notes) and the one
//! forged packet (the peer's FIN, replayed to a restored half-closed socket) in
//! [`packet`]; everything else is safe code.

pub mod backoff;
#[doc(hidden)]
pub mod fuzzing;
pub mod greet;
pub mod image;
pub mod log;
pub mod machine;
pub mod packet;
pub mod repair;

pub use image::{
    capture, delete, first_flight, restart, restore, unfreeze, DeleteError, ImageError, Keepalive,
    RecvImage, RestoreOptions, SendFin, SendImage, SockOpts, SocketImage, TcpOptionsImage,
    TcpState, UnackedRestore, WindowImage, WindowScale,
};
