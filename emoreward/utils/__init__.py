"""Small helpers shared by every stage (atomic file writes)."""
