//! Stager (being written).
