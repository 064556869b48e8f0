# The binding's own C++ (errors.hpp) and, in the .pxi files, the code that binds each core header.
