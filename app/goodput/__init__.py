"""The goodput ledger: what each fault cost a job, and what RLGuard saved."""
