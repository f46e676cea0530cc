"""Model card templates."""
