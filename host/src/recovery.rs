//! Recovery: what went wrong with a call ([`Failure`]), what it means
//! ([`classify`]), whether and when to try again ([`backoff`], [`retry_after`],
//! [`budget`], [`breaker`]), and what the agent is told when nothing works ([`report`]).
//!
//! Architecture invariant: nothing here does I/O; time and randomness come through
//! [`clock::Clock`] and [`clock::Rng`].

pub mod backoff;
pub mod breaker;
pub mod budget;
pub mod classify;
pub mod clock;
pub mod engine;
pub mod failure;
pub mod plan;
pub mod report;
pub mod retry_after;

pub use failure::Failure;
