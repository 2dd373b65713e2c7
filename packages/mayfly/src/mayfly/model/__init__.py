"""The durable data model: identities, specifications, outcomes, events, commands and state."""
