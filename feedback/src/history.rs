//! rf history of past runs (written by the learned-schedule work; see issue on adaptive rf).
