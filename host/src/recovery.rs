//! Recovery: what went wrong with a call ([`Failure`]) and what the agent is told when
//! nothing more can be done ([`report`]).

pub mod failure;
pub mod report;

pub use failure::Failure;
