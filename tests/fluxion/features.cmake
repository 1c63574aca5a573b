# flx_features tests: the 41 features against a slow double oracle, the kvstore path, and least
# budgets / labels against the runtime's sparse attention.
flx_add_test(test_budget SOURCES features/test_budget.c LIBS flx_features LABELS unit)
flx_add_test(test_features SOURCES features/test_features.c LIBS flx_features flx_kvstore LABELS unit)
