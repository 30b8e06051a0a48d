"""Long-context drafting with sparse KV views (BudgetDraft's setting)."""
