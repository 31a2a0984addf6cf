//! Aggregate-cache mode's pure part: which node holds what in each epoch, where each node gets
//! the next epoch's samples, and how they cross the network, uncoded or coded.
//!
//! A dataset too big for one node's budget but smaller than all the nodes' budgets together
//! is read from the capacity tier once, in epoch 0; after that each epoch's new assignment of
//! samples to nodes is filled from the other nodes' caches. Nothing here does I/O or talks to
//! another rank: every node computes the same plan from the same inputs, and the transport
//! (MPI, elsewhere) carries out what the plan says, counting what crosses the wire.
//!
//! * [`plan`]: the shares `S(e, i)`, the caches (share plus extras kept with probability `p`,
//!   within a byte budget), and each sample's source for the next epoch: local, a peer, or
//!   the tier.
//! * [`coded`]: UberShuffle (paper 002, §2.2 and §3): the coding tables, the carpool step,
//!   encoding and byte-exact decoding of XOR packets over fixed-size blocks.
//! * [`wire`]: what each scheme costs on the wire (bytes, messages, tier reads, the busiest
//!   port), for the uncoded peer exchange (the baseline), the paper's extra-rank model and a
//!   peers mode where holders send, with the pseudo-broadcast by scatter-then-ring (Theorem 3).
//! * [`theory`]: Theorem 1's prediction for the coded/uncoded ratio.

pub mod coded;
pub mod nodeset;
pub mod plan;
mod rng;
pub mod theory;
pub mod wire;

pub use nodeset::{NodeSet, MAX_NODES};
pub use plan::{
    layout, transition, AggregateConfig, Layout, NodePlan, PlanError, Transition, NO_OWNER,
};
