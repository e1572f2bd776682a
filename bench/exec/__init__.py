"""The training core (torch and numpy only)."""
