"""What a layout serves: step costs on the hardware's roofline (costs), vLLM's scheduler in
steady state and queueing (serving), the workload and SLO (workload), and the instance's
prediction from its memory estimate (predict)."""
