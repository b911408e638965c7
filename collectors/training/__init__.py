"""What runs inside the user's training process: the step timer, the heartbeat record it keeps in
shared memory, and the flight-recorder dump trigger. Nothing here may raise into training."""
