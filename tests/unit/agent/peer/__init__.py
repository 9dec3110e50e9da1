"""Unit tests of the agent's peer server library."""
